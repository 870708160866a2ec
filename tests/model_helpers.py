"""Test helpers for the model layer: a tiny block-table harness and an independent reference.

``Harness`` drives ``LlamaModel`` the way the runner will (packed tokens, AttentionMetadata,
one KVCache) with its own trivial block allocation (contiguous, or shuffled to exercise
paging). ``RefLlama`` is a plain, non-paged Llama written from the llama2.c/Meta reference
(complex-number RoPE, repeated KV heads, explicit causal mask, full recompute each step) that
reads the llama2.c checkpoint itself, so it shares no code with ``engine``.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import numpy as np
import torch

from inferctl.engine.attention import AttentionMetadata, KVCache


class Harness:
    """Sequences with block tables over one KVCache; ``shuffle`` hands out blocks in random order."""

    def __init__(self, model, block_size: int = 16, num_blocks: int = 256, shuffle: bool = False,
                 kv_int8: bool = False, seed: int = 0):
        a = model.args
        self.model = model
        self.block_size = block_size
        self.cache = KVCache.allocate(a.n_layers, num_blocks, block_size, a.n_kv_heads, a.head_dim,
                                      model.dtype, model.device, kv_int8=kv_int8)
        free = list(range(num_blocks))
        if shuffle:
            random.Random(seed).shuffle(free)
        self.free = free
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def _ensure(self, sid: int, total: int) -> list[int]:
        t = self.tables.setdefault(sid, [])
        while len(t) * self.block_size < total:
            t.append(self.free.pop(0))
        return t

    def step(self, chunks: list[tuple[int, list[int], bool]]) -> torch.Tensor:
        """Run one packed step. chunks: (seq_id, new_token_ids, all_logits). Returns logits [N, V]."""
        meta_chunks, ids, pos = [], [], []
        for sid, toks, all_logits in chunks:
            cached = self.lens.get(sid, 0)
            table = self._ensure(sid, cached + len(toks))
            meta_chunks.append((table, cached, len(toks), all_logits))
            ids.extend(toks)
            pos.extend(range(cached, cached + len(toks)))
        meta = AttentionMetadata.build(meta_chunks, self.block_size, self.model.device)
        with torch.inference_mode():
            logits = self.model(torch.tensor(ids, device=self.model.device),
                                torch.tensor(pos, device=self.model.device), self.cache, meta)
        for sid, toks, _ in chunks:
            self.lens[sid] = self.lens.get(sid, 0) + len(toks)
        return logits

    def greedy(self, sid: int, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
        """Prefill ``prompt`` then ``n`` greedy decode steps; returns (new tokens, logits rows used)."""
        logits = self.step([(sid, prompt, False)])[-1]
        out, rows = [], [logits]
        for _ in range(n):
            t = int(logits.argmax())
            out.append(t)
            logits = self.step([(sid, [t], False)])[-1]
            rows.append(logits)
        return out, rows[:-1]



def decode_steps(model, fused: bool, monkeypatch, prompts, n_decode: int, block_size: int, together: bool = True):
    """Prefill each prompt, then ``n_decode`` greedy decode steps over a shuffled :class:`Harness`;
    all sequences decode in one step when ``together``. ``fused`` False patches
    ``fused_decode.layer_weights`` to None (the model's per-op path). Attention is torch's per-op
    ``paged_attention`` outside the fused op on both sides (the reference; the C++ op sums in
    another order). Returns (logits of every decode step stacked [n_decode, B, vocab], the greedy
    tokens fed at each step, the harness)."""
    from inferctl.engine import fused_decode
    from inferctl.engine import model as model_mod
    from inferctl.engine.attention import paged_attention

    with monkeypatch.context() as mp:
        mp.setattr(model_mod, "paged_attention", lambda *a: paged_attention(*a[:6]))
        if not fused:
            mp.setattr(fused_decode, "layer_weights", lambda *a, **k: None)
        h = Harness(model, block_size=block_size, shuffle=True, seed=3)
        last = {s: h.step([(s, p, False)])[-1] for s, p in enumerate(prompts)}
        rows, toks = [], []
        for _ in range(n_decode):
            step = [(s, [int(last[s].argmax())], False) for s in last]
            toks.append([c[1][0] for c in step])
            if together:
                out = h.step(step)
            else:
                out = torch.stack([h.step([c])[0] for c in step])
            last = {s: out[i] for i, s in enumerate(last)}
            rows.append(out)
        return torch.stack(rows), toks, h

class RefLlama:
    """Plain llama2.c-format Llama (float64 optional) for cross-checking; full recompute."""

    def __init__(self, path: Path, dtype: torch.dtype = torch.float32):
        buf = Path(path).read_bytes()
        dim, hidden, L, H, Hkv, vocab, seq_len = struct.unpack_from("<7i", buf, 0)
        shared = vocab > 0
        vocab = abs(vocab)
        hd = dim // H
        arr = np.frombuffer(buf, dtype="<f4", offset=28)
        off = 0

        def take(*shape):
            nonlocal off
            n = int(np.prod(shape))
            t = torch.from_numpy(arr[off:off + n].copy()).reshape(shape).to(dtype)
            off += n
            return t

        self.emb = take(vocab, dim)
        self.rms_att = take(L, dim)
        self.wq = take(L, dim, dim)
        self.wk = take(L, Hkv * hd, dim)
        self.wv = take(L, Hkv * hd, dim)
        self.wo = take(L, dim, dim)
        self.rms_ffn = take(L, dim)
        self.w1 = take(L, hidden, dim)
        self.w2 = take(L, dim, hidden)
        self.w3 = take(L, hidden, dim)
        self.rms_final = take(dim)
        off += seq_len * hd
        self.wcls = self.emb if shared else take(vocab, dim)
        self.dim, self.L, self.H, self.Hkv, self.hd, self.dtype = dim, L, H, Hkv, hd, dtype

    def _rms(self, x, w):
        return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5))

    def _rope(self, x, T):
        # Meta reference: view pairs as complex numbers and multiply by e^{i·pos·θ_k}
        freqs = 1.0 / (10000.0 ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
        ang = torch.outer(torch.arange(T, dtype=torch.float64), freqs)
        cis = torch.polar(torch.ones_like(ang), ang)  # [T, hd/2]
        xc = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(xc * cis[:, None, :]).flatten(-2).to(self.dtype)

    def logits(self, tokens: list[int]) -> torch.Tensor:
        """Logits [T, vocab] for every position of ``tokens``."""
        T = len(tokens)
        x = self.emb[torch.tensor(tokens)]
        mask = torch.full((T, T), float("-inf"), dtype=self.dtype).triu(1)
        rep = self.H // self.Hkv
        for i in range(self.L):
            xn = self._rms(x, self.rms_att[i])
            q = self._rope((xn @ self.wq[i].T).view(T, self.H, self.hd), T)
            k = self._rope((xn @ self.wk[i].T).view(T, self.Hkv, self.hd), T)
            v = (xn @ self.wv[i].T).view(T, self.Hkv, self.hd)
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            att = torch.einsum("qhd,khd->hqk", q, k) / (self.hd ** 0.5) + mask
            att = torch.softmax(att, dim=-1)
            o = torch.einsum("hqk,khd->qhd", att, v).reshape(T, self.dim)
            x = x + o @ self.wo[i].T
            xn = self._rms(x, self.rms_ffn[i])
            x = x + (torch.nn.functional.silu(xn @ self.w1[i].T) * (xn @ self.w3[i].T)) @ self.w2[i].T
        return self._rms(x, self.rms_final) @ self.wcls.T

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        toks = list(prompt)
        for _ in range(n):
            toks.append(int(self.logits(toks)[-1].argmax()))
        return toks[len(prompt):]
