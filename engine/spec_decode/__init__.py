"""Speculative decoding: proposers (ngram prompt lookup, a draft model, the target's own int8
copy), the verification step over the paged KV cache and the accept/reject rule
(docs/speculative-decoding.md)."""
