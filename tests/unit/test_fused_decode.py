"""engine.fused_decode: decode steps in one C++ call give the per-op path's logits, KV and tokens.

Each case runs the same steps twice over identical block allocations: once with the fused op
(``torch.ops.inferctl_cpu.decode_layers``), once with :func:`fused_decode.layer_weights` patched to
None (the model's per-op path, unchanged). Tolerance: the op sums in 8-lane partial sums (dot
products, GEMVs) where torch sums in its own order, so logits differ by fp32 rounding:
``TOL_REL`` of the largest |logit| (measured ~4e-7 on stories260K). Precisions: fp32 ("full"),
int8 per channel and int4 (GGUF Q4_1 blocks, engine.q4_kernels), each against the per-op path in the
same precision (the same GEMV kernels, so only the layer glue differs).
"""

from __future__ import annotations

import pytest
import torch

from inferctl.engine import cpu_kernels, fused_decode, onednn
from inferctl.engine.attention import AttentionMetadata
from inferctl.engine.loader import load_llama2c
from inferctl.engine.model import LlamaModel, ModelArgs, canonical_weight_names
from tests.model_helpers import Harness, decode_steps

OPS = cpu_kernels.ops_for("cpu", torch.float32)
needs_ops = pytest.mark.skipif(OPS is None, reason="CPU kernels did not build here (no compiler/ninja)")
TOL_REL = 1e-5
TOL_INT8 = 5e-3


@pytest.fixture(scope="module")
def stories(stories_dir):
    return load_llama2c(stories_dir / "stories260K.bin")


def _random_model(rope_style: str, seed: int = 0, tie: bool = True) -> LlamaModel:
    """A small GQA model (4 query heads over 2 KV heads, head_dim 16) with N(0, 0.3²) weights."""
    args = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, hidden_dim=96,
                     max_seq_len=256, rope_style=rope_style, tie_embeddings=tie)
    g = torch.Generator().manual_seed(seed)
    w = {n: torch.randn(s, generator=g) * (1.0 if n.endswith("norm.weight") else 0.3)
         for n, s in canonical_weight_names(args).items()}
    return LlamaModel(args, w)


class _Spy:
    """Counts the fused op's calls (wraps fused_decode.decode_layers and decode_tokens, its two entries:
    ``by_ids`` counts the calls that passed token ids and positions)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        self.by_ids = 0
        for name in ("decode_layers", "decode_tokens"):
            monkeypatch.setattr(fused_decode, name, self._wrap(getattr(fused_decode, name), name == "decode_tokens"))

    def _wrap(self, real, by_ids):
        def spy(*a, **k):
            self.calls += 1
            self.by_ids += by_ids
            return real(*a, **k)
        return spy


def _run(model, fused: bool, monkeypatch, prompts, n_decode, block_size, together=True):
    """tests.model_helpers.decode_steps (attention off the C++ paged_attention op in both runs: the
    reference is torch's per-op path; the op sums in another order, which int8's activation rounding
    can amplify; its own tests bound it)."""
    return decode_steps(model, fused, monkeypatch, prompts, n_decode, block_size, together)


def _assert_close(a: torch.Tensor, b: torch.Tensor, tol_rel: float = TOL_REL) -> None:
    diff = (a - b).abs().max().item()
    assert diff <= tol_rel * max(1.0, b.abs().max().item()), diff


@needs_ops
@pytest.mark.parametrize("precision", ["full", "int8", "int4"])
@pytest.mark.parametrize("batch", [1, 3])
def test_stories260k_fused_equals_per_op(stories, stories_dir, monkeypatch, precision, batch):
    # int4 is one-way (start-time only): a model of its own; GGUF Q4_1 blocks through the kernels
    model = stories.model if precision != "int4" else load_llama2c(stories_dir / "stories260K.bin").model
    model.set_precision(precision)
    if precision == "int4":
        assert type(model.layers[0].wqkv.q).__name__ == "Q4Weight"
    try:
        texts = ["Once upon a time, there was a big dog", "Tom had a", "The sun was hot and the girl went to the park"]
        prompts = [stories.tokenizer.encode(t) for t in texts[:batch]]
        spy = _Spy(monkeypatch)
        fused, ft, hf = _run(model, True, monkeypatch, prompts, 12, block_size=5)
        assert spy.calls == 12      # every decode step took the fused op, no prefill did
        assert spy.by_ids == 12     # with the token ids and positions (the op reads embedding and RoPE rows)
        plain, pt, hp = _run(model, False, monkeypatch, prompts, 12, block_size=5)
        assert spy.calls == 12
        assert ft == pt             # greedy tokens identical
        _assert_close(fused, plain)
        _assert_close(hf.cache.k, hp.cache.k)   # the K/V the op wrote at slot_mapping
        _assert_close(hf.cache.v, hp.cache.v)
    finally:
        if precision != "int4":
            model.set_precision("full")


@needs_ops
@pytest.mark.parametrize("rope_style", ["interleaved", "half"])
@pytest.mark.parametrize("precision", ["full", "int8", "int4"])
def test_random_gqa_model_three_sequences(monkeypatch, rope_style, precision):
    """n_kv_heads < n_heads, 3 sequences of different lengths over several shuffled 4-token blocks."""
    model = _random_model(rope_style)
    model.set_precision(precision)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (3, 9, 14)]
    spy = _Spy(monkeypatch)
    fused, ft, hf = _run(model, True, monkeypatch, prompts, 8, block_size=4)
    plain, pt, hp = _run(model, False, monkeypatch, prompts, 8, block_size=4)
    assert spy.calls == 8
    assert fused.shape == (8, 3, 97)
    assert ft == pt
    _assert_close(fused, plain)
    _assert_close(hf.cache.k, hp.cache.k)


@needs_ops
@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("precision", ["full", "int8"])
@pytest.mark.parametrize("batch", [9, 17, 33])
def test_batches_past_8_run_fused_and_equal_per_op(monkeypatch, precision, batch, nthreads):
    """9-33 sequences decode in one fused call each step (cpu_kernels.MAX_DECODE_BATCH), with the fp32
    linears on gemv_f32 or torch's GEMM inside the op as f32_kernel_wins says for the thread count;
    logits, K/V and greedy tokens equal the per-op path's."""
    before = torch.get_num_threads()
    torch.set_num_threads(nthreads)
    try:
        model = _random_model("half", seed=5)
        model.set_precision(precision)
        g = torch.Generator().manual_seed(batch)
        prompts = [torch.randint(0, 97, (int(n),), generator=g).tolist()      # >= 2 tokens: a prefill
                   for n in torch.randint(2, 12, (batch,), generator=g)]
        spy = _Spy(monkeypatch)
        fused, ft, hf = _run(model, True, monkeypatch, prompts, 4, block_size=4)
        assert spy.calls == 4
        plain, pt, hp = _run(model, False, monkeypatch, prompts, 4, block_size=4)
        assert fused.shape == (4, batch, 97)
        assert ft == pt
        # int8: gemv_int8 rounds its activations per block of 32 (Q8_0), so an fp32-rounding difference in
        # the glue (attention's summation order) can move one activation by a whole step (absmax/127) and a
        # logit by ~1e-3 of the largest (measured 1.8e-3 at 9 sequences); fp32 stays at TOL_REL
        tol = TOL_REL if precision == "full" else TOL_INT8
        _assert_close(fused, plain, tol)
        _assert_close(hf.cache.k, hp.cache.k, tol)
        _assert_close(hf.cache.v, hp.cache.v, tol)
    finally:
        torch.set_num_threads(before)


@needs_ops
def test_torch_mm_mask_gives_the_gemv_result(stories):
    """The op's fp32 linears through torch's GEMM (mask 0b1111), through oneDNN's (the mask's oneDNN bits, where
    this torch has it) and through gemv_f32 (mask 0) agree."""
    model = stories.model
    h = Harness(model, block_size=4, num_blocks=64)
    n = 12
    meta = AttentionMetadata.build([([i], 0, 1, False) for i in range(n)], 4)
    meta.prepare(4)
    an, fn, w, s = fused_decode.layer_weights(model, h.cache, meta, n)
    a = model.args
    x = torch.randn(n, a.dim, generator=torch.Generator().manual_seed(0))
    cos, sin = model.rope_at(torch.zeros(n, dtype=torch.long), 6)
    out = [OPS.decode_layers(x, cos, sin, h.cache.k.clone(), h.cache.v.clone(), meta.slot_mapping, meta.block_tables,
                             meta.seq_lens, an, fn, w, s, a.n_heads, a.n_kv_heads, 0, a.norm_eps, model.scale, mask)
           for mask in (0, 0b1111, *((0b1111 | 0b1111 << fused_decode.ONEDNN_SHIFT,) if onednn.available() else ()))]
    for other in out[1:]:
        _assert_close(other, out[0])


@needs_ops
def test_batch1_equals_batch3(monkeypatch):
    """A sequence decoded alone and beside two others gives the same logits (per-sequence tables)."""
    model = _random_model("half", seed=2)
    prompts = [[1, 2, 3, 4, 5], [7, 8], [9] * 11]
    together, _, _ = _run(model, True, monkeypatch, prompts, 5, block_size=4)
    alone, _, _ = _run(model, True, monkeypatch, prompts, 5, block_size=4, together=False)
    _assert_close(together, alone)


@needs_ops
def test_precision_switch_between_steps(monkeypatch):
    """The op's weight lists are cached on the model: a switch to int8 and back mid-sequence must
    reach the op (a stale list would run the old weights: int8 and fp32 logits differ by ~1e-2)."""
    def run(fused):
        model = _random_model("interleaved", seed=4)
        with monkeypatch.context() as mp:
            if not fused:
                mp.setattr(fused_decode, "layer_weights", lambda *a, **k: None)
            h = Harness(model, block_size=4)
            rows = [h.step([(0, [1, 2, 3], False)])[-1]]
            for mode in ("full", "full", "int8", "int8", "full"):
                model.set_precision(mode)
                rows.append(h.step([(0, [int(rows[-1].argmax())], False)])[-1])
        return torch.stack(rows)

    fused, plain = run(True), run(False)
    _assert_close(fused, plain)
    assert (fused[3] - fused[2]).abs().max() > 0   # the steps differ (the test sees each precision)


def test_switch_off_keeps_per_op_path(monkeypatch, stories_dir):
    monkeypatch.setenv(cpu_kernels.ENV, "0")
    bundle = load_llama2c(stories_dir / "stories260K.bin")
    spy = _Spy(monkeypatch)
    toks, _ = Harness(bundle.model, block_size=4).greedy(0, bundle.tokenizer.encode("Once upon a time"), 6)
    assert bundle.model.kernel_ops is None
    assert spy.calls == 0
    assert len(toks) == 6


@needs_ops
def test_predicate_falls_back(stories):
    """Prefill steps, more than MAX_DECODE_BATCH (64) sequences and an int8 KV pool take the per-op path."""
    model = stories.model
    h = Harness(model, block_size=4)
    cache_i8 = Harness(model, block_size=4, kv_int8=True).cache
    one = AttentionMetadata.build([([0, 1], 5, 1, False)], 4)
    one.prepare(4)
    assert fused_decode.layer_weights(model, h.cache, one, 1) is not None
    assert fused_decode.layer_weights(model, cache_i8, one, 1) is None
    prefill = AttentionMetadata.build([([0, 1], 0, 5, False)], 4)
    prefill.prepare(4)
    assert fused_decode.layer_weights(model, h.cache, prefill, 5) is None
    for n, runs in ((cpu_kernels.MAX_BATCH + 1, True), (cpu_kernels.MAX_DECODE_BATCH, True),
                    (cpu_kernels.MAX_DECODE_BATCH + 1, False)):
        many = AttentionMetadata.build([([i], 0, 1, False) for i in range(n)], 4)
        many.prepare(4)
        assert (fused_decode.layer_weights(model, Harness(model, block_size=4, num_blocks=80).cache, many, n)
                is not None) == runs


@needs_ops
def test_bad_inputs_raise_runtime_error(stories):
    model = stories.model
    h = Harness(model, block_size=4, num_blocks=8)
    meta = AttentionMetadata.build([([0, 1], 5, 1, False)], 4)
    meta.prepare(4)
    lists = fused_decode.layer_weights(model, h.cache, meta, 1)
    a = model.args
    x = torch.randn(1, a.dim)
    cos, sin = model.rope_at(torch.tensor([5]), 6)

    def call(x=x, slots=meta.slot_mapping, tables=meta.block_tables, lens=meta.seq_lens, lists=lists, k=h.cache.k):
        an, fn, w, s = lists
        return OPS.decode_layers(x, cos, sin, k, h.cache.v, slots, tables, lens, an, fn, w, s, a.n_heads,
                                 a.n_kv_heads, 0, a.norm_eps, model.scale, 0)

    assert call().shape == (1, a.dim)
    cases = {
        "block_tables": dict(tables=torch.tensor([[0, 99]])),
        "slot_mapping": dict(slots=torch.tensor([8 * 4])),
        "seq_lens": dict(lens=torch.tensor([9])),
        "weights/scales": dict(lists=(lists[0], lists[1], lists[2][:-1], lists[3][:-1])),
        "x must be": dict(x=x.double()),
        "k_pool": dict(k=h.cache.k.to(torch.float64)),
    }
    for needle, kw in cases.items():
        with pytest.raises(RuntimeError, match=needle):
            call(**kw)
    too_many = torch.randn(cpu_kernels.MAX_DECODE_BATCH + 1, a.dim)
    with pytest.raises(RuntimeError, match=f"1..{cpu_kernels.MAX_DECODE_BATCH} sequences"):
        call(x=too_many)


@needs_ops
@pytest.mark.parametrize("precision", ["full", "int8"])
def test_the_output_head_runs_inside_the_op(stories, monkeypatch, precision):
    """The final RMSNorm and the classifier run in the fused call (fused_decode.head_tensors): the model's
    own output Linear is not called in a fused step, and the op's logits equal rms_norm + classifier
    applied to its hidden output (the same call without the head)."""
    model = stories.model
    model.set_precision(precision)
    try:
        calls = []
        real = model.output.forward
        monkeypatch.setattr(model.output, "forward", lambda x: calls.append(x.shape[0]) or real(x))
        spy = _Spy(monkeypatch)
        _run(model, True, monkeypatch, [stories.tokenizer.encode("Tom had a")], 3, block_size=4)
        assert spy.calls == 3 and calls == [1]          # the prefill step only
        h = Harness(model, block_size=4, num_blocks=16)
        meta = AttentionMetadata.build([([0, 1], 5, 1, False), ([2], 3, 1, False)], 4)
        meta.prepare(4)
        lists = fused_decode.layer_weights(model, h.cache, meta, 2)
        head = fused_decode.head_tensors(model)
        assert head is not None and head[0] is model.norm
        a = model.args
        x = torch.randn(2, a.dim, generator=torch.Generator().manual_seed(3))
        cos, sin = model.rope_at(torch.tensor([5, 3]), 8)
        args = (x, cos, sin, h.cache.k.clone(), h.cache.v.clone(), meta.slot_mapping, meta.block_tables,
                meta.seq_lens, *lists, a.n_heads, a.n_kv_heads, 0, a.norm_eps, model.scale, 0)
        logits = OPS.decode_layers(*args, *head, False)
        hidden = OPS.decode_layers(*args)
        assert logits.shape == (2, a.vocab_size) and hidden.shape == (2, a.dim)
        _assert_close(logits, real(cpu_kernels.rms_norm(OPS, hidden, model.norm, a.norm_eps)))
        with pytest.raises(RuntimeError, match="final_norm"):
            OPS.decode_layers(*args, model.norm[:-1].contiguous(), head[1], head[2], False)
    finally:
        model.set_precision("full")


def _in_out_classifier(model: LlamaModel) -> LlamaModel:
    """The tied classifier moved to the "in_out" layout (a large one's, engine.model.Linear): the embedding
    rows are then the columns of its [dim, vocab] weight (a strided view for the op)."""
    wt = model.output.weight_t.clone()
    model.output.layout = "in_out"
    model.output.weight_t = wt
    return model


_VARIANTS = {
    "tied full": lambda: _random_model("interleaved", seed=5),
    "tied int8": lambda: _random_model("half", seed=5),
    "untied full": lambda: _random_model("half", seed=6, tie=False),
    "untied int8": lambda: _random_model("interleaved", seed=6, tie=False),
    "tied full in_out": lambda: _in_out_classifier(_random_model("half", seed=7)),
    "int4": lambda: _random_model("interleaved", seed=8),
}


def three_decode_rows(variant: str):
    """A :data:`_VARIANTS` model (switched to the precision its name says) with a 16-block cache and the
    metadata of one decode step of three sequences at positions 5, 3 and 9 over 4-token blocks; returns
    (model, harness, metadata, ``fused_decode.layer_weights``' lists)."""
    model = _VARIANTS[variant]()
    for mode in ("int8", "int4"):
        if mode in variant:
            model.set_precision(mode)
    h = Harness(model, block_size=4, num_blocks=16)
    meta = AttentionMetadata.build([([0, 1], 5, 1, False), ([2], 3, 1, False), ([3, 4, 5], 9, 1, False)], 4)
    meta.prepare(4)
    lists = fused_decode.layer_weights(model, h.cache, meta, 3)
    assert lists is not None
    return model, h, meta, lists


@needs_ops
@pytest.mark.parametrize("variant", list(_VARIANTS))
def test_ids_entry_equals_embed_and_rope_rows(variant):
    """decode_tokens (ids + positions, rows read in the op) gives decode_layers' result over LlamaModel.embed
    and rope_at of the same ids and positions bit for bit: logits (or hidden states) and the K/V written."""
    model, h, meta, lists = three_decode_rows(variant)
    emb = fused_decode.embed_tensors(model)
    assert emb is not None
    head = fused_decode.head_tensors(model)
    assert (head is None) == variant.endswith("in_out")   # an in_out classifier runs outside the op
    a = model.args
    ids, pos = torch.tensor([96, 0, 41]), torch.tensor([5, 3, 9])
    x = model.embed(ids)
    if emb[1] is None:
        assert torch.equal(emb[0].index_select(0, ids), x)
    else:   # int8 rows times their scales: the products LlamaModel.embed returns
        assert torch.equal(emb[0].index_select(0, ids)[:, : a.dim].float() * emb[1].index_select(0, ids)[:, None], x)
    tab = model.rope_table(10, ids.device)
    rest = (meta.slot_mapping, meta.block_tables, meta.seq_lens, *lists, a.n_heads, a.n_kv_heads,
            fused_decode.ROPE_CODES[a.rope_style], a.norm_eps, model.scale, 0, *(head or ()))
    pools = [(h.cache.k.clone(), h.cache.v.clone()) for _ in range(2)]
    by_ids = OPS.decode_tokens(ids, pos, *emb, *tab, *pools[0], *rest)
    by_rows = OPS.decode_layers(x.contiguous(), *model.rope_at(pos, 10), *pools[1], *rest)
    assert by_ids.shape == ((3, a.vocab_size) if head else (3, a.dim))
    assert torch.equal(by_ids, by_rows)
    assert torch.equal(pools[0][0], pools[1][0]) and torch.equal(pools[0][1], pools[1][1])


@needs_ops
@pytest.mark.parametrize("variant", ["untied int8", "tied full in_out"])
def test_model_steps_through_the_ids_entry_equal_per_op(variant, monkeypatch):
    """Whole decode steps of an untied int8 model and of a model whose classifier is in the "in_out" layout
    (the op returns hidden states, the model applies the head) take decode_tokens and match the per-op path."""
    model = _VARIANTS[variant]()
    if "int8" in variant:
        model.set_precision("int8")
    spy = _Spy(monkeypatch)
    fused, ft, _ = _run(model, True, monkeypatch, [[1, 2, 3, 4, 5], [7, 8]], 6, block_size=4)
    assert spy.calls == spy.by_ids == 6
    plain, pt, _ = _run(model, False, monkeypatch, [[1, 2, 3, 4, 5], [7, 8]], 6, block_size=4)
    assert ft == pt
    _assert_close(fused, plain, TOL_INT8 if "int8" in variant else TOL_REL)


@needs_ops
def test_untied_table_follows_precision_switches():
    """The plan's embedding source is the table the model holds after every switch (int8 rows, then back)."""
    model = _random_model("half", seed=9, tie=False)
    h = Harness(model, block_size=4)
    meta = AttentionMetadata.build([([0, 1], 5, 1, False)], 4)
    meta.prepare(4)
    for mode in ("full", "int8", "full", "int8"):
        model.set_precision(mode)
        assert fused_decode.layer_weights(model, h.cache, meta, 1) is not None
        emb = fused_decode.embed_tensors(model)
        if mode == "full":
            assert emb[0] is model.tok_embeddings and emb[1] is None
        else:
            assert emb[0] is model.tok_embeddings_q.qweight and emb[1] is model.tok_embeddings_q.scales


@needs_ops
def test_inputs_embeds_keeps_the_rows_entry(stories, monkeypatch):
    """A caller's inputs_embeds goes through decode_layers (not the ids); the same embeddings give the same
    logits bit for bit."""
    model = stories.model
    spy = _Spy(monkeypatch)
    outs = []
    for embeds in (False, True):
        h = Harness(model, block_size=4)
        h.step([(0, [1, 50, 60, 70], False)])
        meta = AttentionMetadata.build([(h._ensure(0, 5), 4, 1, False)], 4)
        ids, pos = torch.tensor([80]), torch.tensor([4])
        with torch.inference_mode():
            outs.append(model(ids, pos, h.cache, meta, inputs_embeds=model.embed(ids) if embeds else None))
    assert spy.calls == 2 and spy.by_ids == 1
    assert torch.equal(outs[0], outs[1])


@needs_ops
def test_ids_entry_bad_input(stories):
    """A token id outside the table or a position outside the RoPE table raises IndexError (as
    index_select did), from the op and through the model; other bad input a RuntimeError."""
    model = stories.model
    a = model.args
    h = Harness(model, block_size=4, num_blocks=8)
    meta = AttentionMetadata.build([([0, 1], 5, 1, False)], 4)
    meta.prepare(4)
    lists = fused_decode.layer_weights(model, h.cache, meta, 1)
    emb = fused_decode.embed_tensors(model)
    tab = model.rope_table(6, torch.device("cpu"))

    def call(ids=torch.tensor([3]), pos=torch.tensor([5]), emb=emb, tab=tab):
        return OPS.decode_tokens(ids, pos, *emb, *tab, h.cache.k, h.cache.v, meta.slot_mapping, meta.block_tables,
                                 meta.seq_lens, *lists, a.n_heads, a.n_kv_heads, 0, a.norm_eps, model.scale, 0)

    assert call().shape == (1, a.dim)
    for kw in (dict(ids=torch.tensor([a.vocab_size])), dict(ids=torch.tensor([-1])),
               dict(pos=torch.tensor([tab[0].shape[0]]))):
        with pytest.raises(IndexError):
            call(**kw)
    q = model.output.weight.to(torch.int8)
    for needle, kw in {"ids and positions": dict(ids=torch.tensor([3], dtype=torch.int32)),
                       "emb must be": dict(emb=(emb[0].double(), None)),
                       "int8 emb": dict(emb=(q, None)),
                       "cos_table": dict(tab=(tab[0], tab[1][:-1]))}.items():
        with pytest.raises(RuntimeError, match=needle):
            call(**kw)
    hh = Harness(model, block_size=4)
    hh.step([(0, [1, 2], False)])
    with pytest.raises(IndexError):
        hh.step([(0, [a.vocab_size], False)])   # a decode step: the ids entry
