"""The llama2.c checkpoint format's numbers, without torch: what the engine's loader
(:mod:`inferctl.engine.loader`) and ``inferctl plan`` (which imports no torch) both read.

Format (karpathy/llama2.c ``export.py``): a legacy header of 7 int32 (``dim, hidden_dim,
n_layers, n_heads, n_kv_heads, vocab_size, seq_len``; a negative vocab means an unshared
classifier) then float32 weights and the RoPE tables; or, from export version 1, a 256-byte
header starting with the magic ``ak42`` and the version, the same 7 int32 and a shared-classifier
byte, then float32 weights (no RoPE tables).
"""

from __future__ import annotations

#: ``"ak42"``: the magic of a llama2.c ``export.py`` version >= 1 header.
LLAMA2C_MAGIC = 0x616B3432
#: Header bytes by export version (0: legacy).
HEADER_BYTES = {0: 28, 1: 256}


def expected_bytes(version: int, dim: int, hidden: int, n_layers: int, n_heads: int, n_kv: int, vocab: int,
                   seq_len: int, shared: bool) -> int:
    """The size in bytes a checkpoint with this header has: the header, then float32 token
    embeddings, per layer the two norms, wq/wo, wk/wv, w1/w2/w3, the final norm, the legacy
    format's RoPE tables (``seq_len × head_dim``) and an unshared classifier."""
    hd = dim // n_heads
    kv_dim = n_kv * hd
    L = n_layers
    n_floats = (vocab * dim + L * dim * 2 + L * dim * dim * 2 + L * kv_dim * dim * 2 + L * hidden * dim * 3 + dim
                + (seq_len * hd if version == 0 else 0) + (0 if shared else vocab * dim))
    return HEADER_BYTES[version] + 4 * n_floats
