"""The C++ paged-attention op (``torch.ops.inferctl_cpu.paged_attention``, csrc/paged_attention.cpp):
every token of a step attends causally over its sequence's blocks read in place.

Each case is checked twice: against the plain PyTorch path of engine.attention.paged_attention
(gather + bmm/softmax/bmm, SDPA for prefill chunks) and against an explicit causal softmax written
here in float64 over the keys read slot by slot. Tolerance ``ATOL``: the op sums in fp32 with
8-lane partial sums and an online softmax (rescaled per block), so it differs from both by fp32
rounding (measured max |Δ| ~4e-7 on N(0, 1) data).
"""

from __future__ import annotations

import random

import pytest
import torch

from inferctl.engine import attention, cpu_kernels
from inferctl.engine.attention import AttentionMetadata, KVCache, kernel_eligible, paged_attention
from inferctl.engine.loader import load_llama2c
from tests.model_helpers import Harness

OPS = cpu_kernels.ops_for("cpu", torch.float32)
needs_ops = pytest.mark.skipif(OPS is None, reason="CPU kernels did not build here (no compiler/ninja)")
ATOL = 1e-5
LAYERS = 2


def _pool(h_kv: int, d: int, bs: int, nb: int, seed: int = 0, kv_int8: bool = False) -> KVCache:
    g = torch.Generator().manual_seed(seed)
    cache = KVCache.allocate(LAYERS, nb, bs, h_kv, d, torch.float32, "cpu", kv_int8=kv_int8)
    for layer in range(LAYERS):
        cache.write(layer, torch.arange(nb * bs), torch.randn(nb * bs, h_kv, d, generator=g),
                    torch.randn(nb * bs, h_kv, d, generator=g))
    return cache


def _reference64(q: torch.Tensor, cache: KVCache, layer: int, chunks, scale: float) -> torch.Tensor:
    """softmax(q·Kᵀ·scale)·V in float64, token by token, keys 0..pos of its sequence, slot by slot."""
    bs, h_kv = cache.block_size, cache.n_kv_heads
    k_slots = cache.k[layer].reshape(h_kv, -1, cache.k.shape[-1]).double()
    v_slots = cache.v[layer].reshape(h_kv, -1, cache.v.shape[-1]).double()
    T, H, _ = q.shape
    g = H // h_kv
    out = torch.empty(T, H, q.shape[2], dtype=torch.float64)
    t = 0
    for table, cached, new, _ in chunks:
        for j in range(new):
            pos = cached + j
            slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(pos + 1)])
            k = k_slots[:, slots].repeat_interleave(g, 0)          # [H, pos + 1, D]: kv head h // g
            v = v_slots[:, slots].repeat_interleave(g, 0)
            w = torch.softmax((k @ q[t].double()[:, :, None])[:, :, 0] * scale, dim=1)   # [H, pos + 1]
            out[t] = (w[:, None, :] @ v)[:, 0]
            t += 1
    return out


def _chunks(kind: str, bs: int, nb: int, rng: random.Random):
    """(block_table, cached, new, all_logits) per sequence over a shuffled (non-contiguous) pool."""
    free = rng.sample(range(nb), nb)

    def take(total):
        n = (total + bs - 1) // bs
        return [free.pop() for _ in range(n)]

    if kind == "decode":                       # decode only, mixed lengths, one on a block edge
        specs = [(13, 1), (bs - 1, 1), (2 * bs, 1), (0, 1), (40, 1)]
    elif kind == "prefill":                    # prefill only: whole prompts, from empty caches
        specs = [(0, 7), (0, 2 * bs + 3), (0, 1 + bs)]
    elif kind == "mixed":                      # decodes, a chunk spanning blocks, a prefix-cached chunk
        specs = [(9, 1), (bs + 3, 2 * bs), (0, 5), (30, 1), (2 * bs, 3)]
    elif kind == "prefix":                     # a prefix-cache hit (whole blocks) before a chunk
        specs = [(3 * bs, 11)]
    elif kind == "t1":
        specs = [(0, 1)]
    elif kind == "t300":
        specs = [(20, 1), (0, 250), (64, 49)]
    else:
        raise ValueError(kind)
    return [(take(c + n), c, n, n > 1 and i % 2 == 0) for i, (c, n) in enumerate(specs)]


@needs_ops
@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed", "prefix", "t1", "t300"])
@pytest.mark.parametrize("heads,kv_heads,d,bs", [(8, 2, 16, 4), (4, 4, 8, 16), (6, 3, 32, 8)])
def test_op_equals_the_plain_path_and_a_float64_causal_softmax(kind, heads, kv_heads, d, bs):
    nb = 160
    cache = _pool(kv_heads, d, bs, nb)
    rng = random.Random(hash((kind, heads, bs)) & 0xFFFF)
    chunks = _chunks(kind, bs, nb, rng)
    meta = AttentionMetadata.build(chunks, bs)
    T = meta.num_tokens
    if kind == "t300":
        assert T == 300
    q = torch.randn(T, heads, d, generator=torch.Generator().manual_seed(T))
    scale = d ** -0.5
    for layer in range(LAYERS):
        got = paged_attention(q, cache, layer, meta, scale, ops=OPS)
        assert not meta._plain_ready            # the op ran: no gather-path tensors were built
        plain = paged_attention(q, cache, layer, AttentionMetadata.build(chunks, bs), scale)
        ref = _reference64(q, cache, layer, chunks, scale)
        assert got.shape == (T, heads, d) and got.dtype == torch.float32
        assert (got - plain).abs().max() <= ATOL, (kind, layer)
        assert (got.double() - ref).abs().max() <= ATOL, (kind, layer)


#: query tokens per tile of the op (csrc/paged_attention.cpp PA_TILE_TOKENS; MAX_TILE_ROWS = 64 rows of
#: tokens x GQA heads caps it at 64 // g tokens)
TILE = 8


@needs_ops
@pytest.mark.parametrize("new", [TILE, 3 * TILE, TILE - 1, 2 * TILE + 5, 1])
@pytest.mark.parametrize("cached", [0, 3 * 4, 13])
@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (4, 4), (32, 2), (64, 1)])
def test_tiled_chunks_equal_a_float64_causal_softmax(new, cached, heads, kv_heads):
    """A chunk of ``new`` tokens after ``cached`` context tokens (a prefix-cache hit of whole blocks, or a
    partial block), split into tiles of ``TILE`` tokens (fewer where the GQA group is wide: 32 / 2 heads
    gives 4 tokens, 64 / 1 gives 1), each tile sharing the K/V reads; a decode of another sequence in the
    same step; shuffled blocks. Chunk sizes that are and are not multiples of the tile, causal limits
    ending inside a block."""
    d, bs, nb = 16, 4, 80
    cache = _pool(kv_heads, d, bs, nb, seed=new + cached)
    rng = random.Random(new * 100 + cached)
    free = rng.sample(range(nb), nb)
    chunks = []
    for c, n in ((cached, new), (9, 1)):
        chunks.append(([free.pop() for _ in range((c + n + bs - 1) // bs)], c, n, False))
    meta = AttentionMetadata.build(chunks, bs)
    q = torch.randn(meta.num_tokens, heads, d, generator=torch.Generator().manual_seed(new))
    got = paged_attention(q, cache, 0, meta, 0.25, ops=OPS)
    ref = _reference64(q, cache, 0, chunks, 0.25)
    assert (got.double() - ref).abs().max() <= ATOL


@needs_ops
def test_a_token_gets_the_same_bits_alone_and_inside_a_tile():
    """The tile shares K/V reads but not arithmetic: each query row's result is bit-identical to the same
    token attended on its own (a one-token chunk at the same position, i.e. a tile of one)."""
    cache = _pool(2, 16, 4, 40, seed=3)
    table = list(range(39, 39 - 10, -1))
    q = torch.randn(2 * TILE + 3, 6, 16, generator=torch.Generator().manual_seed(4))
    whole = paged_attention(q, cache, 1, AttentionMetadata.build([(table, 10, q.shape[0], False)], 4), 0.3, ops=OPS)
    for j in (0, TILE - 1, TILE, 2 * TILE + 2):
        alone = paged_attention(q[j:j + 1], cache, 1, AttentionMetadata.build([(table, 10 + j, 1, False)], 4), 0.3,
                                ops=OPS)
        assert torch.equal(whole[j], alone[0]), j


@needs_ops
def test_op_reads_a_strided_q_as_the_model_passes_it():
    """The model hands q as ``qk[:, :H]`` (token stride (H + Hkv)·D): no copy, the same numbers."""
    cache = _pool(2, 8, 4, 40)
    chunks = _chunks("mixed", 4, 40, random.Random(5))
    meta = AttentionMetadata.build(chunks, 4)
    qk = torch.randn(meta.num_tokens, 6, 8, generator=torch.Generator().manual_seed(1))
    q = qk[:, :4]
    assert not q.is_contiguous() and kernel_eligible(OPS, q, cache)
    assert torch.equal(paged_attention(q, cache, 1, meta, 0.3, ops=OPS),
                       paged_attention(q.contiguous(), cache, 1, meta, 0.3, ops=OPS))


@needs_ops
def test_bad_inputs_raise_runtime_error():
    cache = _pool(2, 8, 4, 10)
    meta = AttentionMetadata.build([([3, 1], 4, 3, False)], 4)
    q = torch.randn(3, 4, 8)
    op = OPS.paged_attention
    args = dict(q=q, k=cache.k, v=cache.v, layer=0, bt=meta.block_tables, qsl=meta.query_start_loc,
                lens=meta.seq_lens)

    def call(**kw):
        a = {**args, **kw}
        return op(a["q"], a["k"], a["v"], a["layer"], a["bt"], a["qsl"], a["lens"], 0.5)

    assert call().shape == (3, 4, 8)
    bad = [
        (dict(q=q.double()), "q must be"),
        (dict(q=torch.randn(3, 3, 8)), "multiple of"),
        (dict(q=torch.randn(3, 4, 16)), "head_dim"),
        (dict(layer=LAYERS), "layer"),
        (dict(v=cache.v[:, :1].contiguous()), "k_pool/v_pool"),
        (dict(bt=torch.tensor([[3, 99]])), "outside 0..9"),
        (dict(bt=torch.tensor([[3, -1]])), "outside 0..9"),
        (dict(lens=torch.tensor([9])), "seq_lens"),
        (dict(lens=torch.tensor([2])), "seq_lens"),
        (dict(qsl=torch.tensor([0, 2])), "query_start_loc"),
        (dict(qsl=torch.tensor([0, 3, 3]), lens=torch.tensor([7, 7]), bt=torch.tensor([[3, 1], [3, 1]])),
         "must increase"),
        (dict(bt=meta.block_tables.int()), "block_tables"),
    ]
    for kw, msg in bad:
        with pytest.raises(RuntimeError, match=msg):
            call(**kw)


def test_predicate_keeps_int8_kv_cuda_and_no_kernels_on_the_plain_path():
    q = torch.randn(3, 4, 8)
    fp32, int8 = _pool(2, 8, 4, 10), _pool(2, 8, 4, 10, kv_int8=True)
    assert not kernel_eligible(None, q, fp32)            # INFERCTL_CPU_KERNELS=0 / no build: ops is None
    if OPS is not None:
        assert kernel_eligible(OPS, q, fp32)
        assert not kernel_eligible(OPS, q, int8)
        assert not kernel_eligible(OPS, q.bfloat16(), fp32)
        assert not kernel_eligible(OPS, q.transpose(1, 2), fp32)   # rows of D not contiguous


def test_int8_pool_with_ops_given_takes_the_plain_path():
    cache = _pool(2, 8, 4, 10, kv_int8=True)
    chunks = [([3, 1], 4, 3, False), ([5], 2, 1, False)]
    q = torch.randn(4, 4, 8, generator=torch.Generator().manual_seed(0))
    meta = AttentionMetadata.build(chunks, 4)
    out = paged_attention(q, cache, 0, meta, 0.4, ops=OPS)
    assert meta._plain_ready
    assert torch.equal(out, paged_attention(q, cache, 0, AttentionMetadata.build(chunks, 4), 0.4))


@pytest.fixture(scope="module")
def stories(stories_dir):
    return load_llama2c(stories_dir / "stories260K.bin")


def _greedy_mixed(stories, monkeypatch, use_op: bool):
    """Two prompts prefilled in one step, then steps mixing a third prompt's chunks with decodes
    (the fused decode op is off, so every step runs paged_attention). Returns (tokens, logits)."""
    from inferctl.engine import fused_decode
    from inferctl.engine import model as model_mod

    model = stories.model
    calls = []
    real = model_mod.paged_attention

    def spy(q, kv, layer, meta, scale, impl="matmul", ops=None):
        calls.append(kernel_eligible(ops, q, kv))
        return real(q, kv, layer, meta, scale, impl, ops if use_op else None)

    with monkeypatch.context() as mp:
        mp.setattr(model_mod, "paged_attention", spy)
        mp.setattr(fused_decode, "layer_weights", lambda *a, **k: None)
        h = Harness(model, block_size=4, shuffle=True)
        enc = stories.tokenizer.encode
        p0, p1 = enc("The cat sat"), enc("Once upon a time there was")
        p2 = enc("Lily and Ben went to the park to play with a big red ball and a dog")
        logits = h.step([(0, p0, False), (1, p1, True)])
        toks = {0: [int(logits[0].argmax())], 1: [int(logits[-1].argmax())]}
        rows = [logits]
        for i in range(6):
            chunk = [(2, p2[i * 7:(i + 1) * 7], False)] if i * 7 < len(p2) else []
            logits = h.step([(0, toks[0][-1:], False), *chunk, (1, toks[1][-1:], False)])
            toks[0].append(int(logits[0].argmax()))
            toks[1].append(int(logits[-1].argmax()))
            rows.append(logits)
    return toks, rows, calls


@needs_ops
def test_model_greedy_tokens_with_the_op_equal_the_plain_path(stories, monkeypatch):
    model = stories.model
    assert model.kernel_ops is not None
    t_op, l_op, calls_op = _greedy_mixed(stories, monkeypatch, True)
    t_pl, l_pl, _ = _greedy_mixed(stories, monkeypatch, False)
    assert all(calls_op) and len(calls_op) == 7 * model.args.n_layers
    assert t_op == t_pl
    for a, b in zip(l_op, l_pl):
        assert (a - b).abs().max() <= 1e-4 * b.abs().max()


def test_switch_off_keeps_the_plain_path(stories_dir, monkeypatch):
    monkeypatch.setenv(cpu_kernels.ENV, "0")
    bundle = load_llama2c(stories_dir / "stories260K.bin")
    assert bundle.model.kernel_ops is None
    seen = []
    real = attention.AttentionMetadata.prepare_plain

    def spy(self, block_size):
        seen.append(block_size)
        return real(self, block_size)

    monkeypatch.setattr(attention.AttentionMetadata, "prepare_plain", spy)
    toks, _ = Harness(bundle.model, block_size=4).greedy(0, bundle.tokenizer.encode("Once upon a time"), 4)
    assert len(toks) == 4 and seen     # the gather path ran (the fused decode op is off too)
