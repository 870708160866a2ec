"""The accept/reject rule of speculative decoding, and the target's sampling distribution.

Greedy rows (temperature 0): a draft token is accepted while it equals the target's argmax
at its position; the first mismatch is replaced by the target's argmax, and when every draft
is accepted the target's argmax after the last one is a bonus token. So the emitted tokens are
exactly the tokens non-speculative greedy decoding emits.

Sampled rows: speculative sampling (Leviathan, Kalman & Matias 2023, "Fast Inference from
Transformers via Speculative Decoding", algorithm 1; Chen et al. 2023, "Accelerating Large
Language Model Decoding with Speculative Sampling", algorithm 2). For draft token ``d_j`` drawn
from the draft's distribution ``q_j``, accept with probability ``min(1, p_j(d_j) / q_j(d_j))``
(``p_j`` the target's distribution at that position); on the first rejection emit a token
drawn from ``norm(max(0, p_j - q_j))`` and stop; when all k are accepted, emit a bonus token
drawn from ``p_{k+1}``. Each emitted token is then distributed exactly as ``p`` (theorem 3.5
of Leviathan et al.). The ngram proposer's draft is deterministic: ``q_j`` is a point mass on
``d_j``, so acceptance is ``p_j(d_j)`` and the residual is ``p_j`` with ``d_j`` removed.

``p`` is the distribution the engine's :class:`~inferctl.engine.sampler.Sampler` draws from:
penalties, temperature, top-k, top-p, in the sampler's order (:func:`target_probs`).
"""

from __future__ import annotations

import torch

from inferctl.engine.sampler import _FLOAT32_MAX, apply_penalties, top_k_top_p_mask
from inferctl.engine.sampling_params import SamplingParams


def sanitize(logits: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """The sampler's non-finite handling: NaN → -inf, +inf → float32 max; returns the sanitized
    float32 logits [m, V] and the rows with no finite value at all (their token is an error)."""
    work = logits.float()
    if bool(torch.isfinite(work.sum())):
        return work, []
    work = work.masked_fill(torch.isnan(work), float("-inf")).clamp(max=_FLOAT32_MAX)
    dead = ~torch.isfinite(work).any(dim=-1)
    rows = dead.nonzero().flatten().tolist()
    if rows:
        work = work.masked_fill(dead.unsqueeze(1), 0.0)
    return work, rows


def target_probs(work: torch.Tensor, params: SamplingParams, histories: list[list[int]] | None = None,
                 prompt_len: int | None = None, penalties: bool = True) -> torch.Tensor:
    """Row-normalised sampling distribution [m, V] (float32) of one request's rows.

    ``work``: sanitized logits [m, V]; ``histories``: the token history of each row (prompt +
    output + the drafts before it), used only when ``params`` has penalties. Same order as the
    sampler: penalties, ``softmax(logits / temperature)``, top-k then top-p, renormalised. A row
    left without positive finite mass takes its best logit (point mass), as the sampler does.
    ``penalties=False`` skips the penalties (the draft model's distribution ``q`` ignores them).
    """
    m = work.shape[0]
    if penalties and params.has_penalties:
        if histories is None or len(histories) != m:
            raise ValueError(f"target_probs: {m} rows need {m} token histories")
        work = apply_penalties(work, [params] * m, histories,
                               None if prompt_len is None else [prompt_len] * m)
    probs = torch.softmax((work / params.temperature).clamp(max=_FLOAT32_MAX), dim=-1)
    if params.top_k > 0 or params.top_p < 1.0:
        probs = probs * top_k_top_p_mask(probs, [params.top_k] * m, [params.top_p] * m)
    total = probs.sum(dim=-1, keepdim=True)
    bad = ~(torch.isfinite(total) & (total > 0)).squeeze(1)
    if bool(bad.any()):
        best = torch.nan_to_num(work[bad], nan=float("-inf")).argmax(dim=-1)
        onehot = torch.zeros_like(probs[bad])
        onehot[torch.arange(onehot.shape[0], device=probs.device), best] = 1.0
        probs[bad] = onehot
        total = probs.sum(dim=-1, keepdim=True)
    return probs / total


def greedy_accept(target_tokens: list[int], drafts: list[int]) -> tuple[list[int], int]:
    """Greedy verification. ``target_tokens``: the target's argmax at each of the k+1 positions;
    ``drafts``: the k draft tokens. Returns ``(emitted, accepted)``: the accepted drafts then the
    target's token at the first mismatch (or the bonus token), and how many drafts were accepted.
    """
    a = 0
    k = len(drafts)
    while a < k and drafts[a] == target_tokens[a]:
        a += 1
    return list(drafts[:a]) + [target_tokens[a]], a


def _draw(probs: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=gen).item())


def rejection_sample(p: torch.Tensor, drafts: list[int], q: torch.Tensor | None,
                     gen: torch.Generator) -> tuple[list[int], int]:
    """Speculative sampling of one request (see the module docstring).

    Args:
        p: target distributions [k+1, V] (rows sum to 1).
        drafts: the k draft tokens.
        q: draft distributions [k, V] the drafts were drawn from, or None for a deterministic
            draft (point mass on each draft token: the ngram proposer).
        gen: the request's generator (seeded requests) or a shared one, on ``p``'s device.

    Returns ``(emitted, accepted)``: 1..k+1 tokens, each distributed as the target's ``p``.
    Raises ValueError when the shapes do not match.
    """
    k = len(drafts)
    if p.shape[0] != k + 1 or (q is not None and q.shape[0] != k):
        raise ValueError(f"rejection_sample: {k} drafts need p [{k + 1}, V] and q [{k}, V], "
                         f"got p {tuple(p.shape)}, q {None if q is None else tuple(q.shape)}")
    u = torch.rand(k, dtype=torch.float64, generator=gen, device=p.device).tolist() if k else []
    p_d = p[torch.arange(k, device=p.device), torch.tensor(drafts, device=p.device)].double().tolist() if k else []
    q_d = ([1.0] * k if q is None else
           q[torch.arange(k, device=q.device), torch.tensor(drafts, device=q.device)].double().tolist())
    for j in range(k):
        # accept with probability min(1, p/q): u < p/q  <=>  u * q < p  (q(d) > 0: d was drawn from q)
        if u[j] * q_d[j] < p_d[j]:
            continue
        if q is None:
            residual = p[j].clone()
            residual[drafts[j]] = 0.0
        else:
            residual = (p[j] - q[j]).clamp(min=0.0)
        if not float(residual.sum()) > 0.0:   # p == q on the support: rejection has probability 0
            residual = p[j]
        return list(drafts[:j]) + [_draw(residual, gen)], j
    return list(drafts) + [_draw(p[k], gen)], k
