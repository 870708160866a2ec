"""engine.cpu_kernels: each op against its torch reference on the real shapes, the layout Linear
chooses at load, the env switch and the fallback when the build fails (simulated).

Tolerances: the GEMV kernels sum in 8-lane partial sums, torch's BLAS in its own order; for
N(0, 1) data over K ≤ 1024 the difference stays below 1e-4 absolute (|y| ~ sqrt(K) ≈ 20–32),
i.e. fp32 rounding. The int8 kernel quantizes the activations per block of 32 (llama.cpp Q8_0):
it is held to the exact bound that rounding implies against dequantize-then-matmul, and to
1e-5 relative against the Q8_0 product emulated in float64.
"""

from __future__ import annotations

import functools
import logging

import pytest
import torch

from inferctl.engine import cpu_kernels as ck
from inferctl.engine import onednn
from inferctl.engine.model import Linear
from inferctl.engine.quant import quantize_per_channel

OPS = ck.ops_for("cpu", torch.float32)
needs_ops = pytest.mark.skipif(OPS is None, reason="CPU kernels did not build here (no compiler/ninja)")
# The synthetic 99.5 MB model's shapes (bench/models.py: dim 384, FFN 1024, 6/2 heads × 64, vocab 32000),
# stories260K's (dim 64, FFN 172, vocab 512) and odd ones that exercise the tails (K % 8, K % 32, N % 4).
SHAPES = [(640, 384), (384, 384), (2048, 384), (384, 1024), (32000, 384), (128, 64), (344, 64), (64, 172),
          (512, 64), (5, 3), (33, 41)]


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """Runs the test at 1 and at 2 threads (at::parallel_for splits the output rows differently)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@needs_ops
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("b", [1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 64])
def test_gemv_f32_matches_torch(n, k, b, threads):
    g = _g(n * 1000 + k + b)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(b, k, generator=g)
    y = ck.gemv_f32(OPS, x, w)
    assert y.shape == (b, n) and y.dtype == torch.float32
    torch.testing.assert_close(y, x.double().matmul(w.double().t()).float(), rtol=1e-5, atol=1e-4)


@needs_ops
@pytest.mark.parametrize("n,k", [(128, 64), (344, 64), (64, 172), (67, 70), (33, 41)])
def test_gemv_f32_rows_in_pairs_equal_rows_alone(n, k, threads):
    """gemv_f32 takes activation rows in pairs, and reduces a pair's 8 accumulators (4 weight rows x 2 rows) with
    one transposed reduction (hsum8x8) where a lone row takes hsum8 per accumulator: the same adds in the same
    order, so each row of a 2- or 3-row call equals, bit for bit, the same row computed alone (a wrong lane order
    in the transposed reduction would put another output's sum there)."""
    g = _g(n + 31 * k)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(3, k, generator=g)
    alone = torch.cat([ck.gemv_f32(OPS, x[i:i + 1].contiguous(), w) for i in range(3)])
    assert torch.equal(ck.gemv_f32(OPS, x, w), alone)
    assert torch.equal(ck.gemv_f32(OPS, x[:2].contiguous(), w), alone[:2])


@needs_ops
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("b", [1, 4, 7, 9, 16, 33, 64])
def test_gemv_int8_matches_dequantize_then_matmul(n, k, b, threads):
    g = _g(n + k * 7 + b)
    q = quantize_per_channel(torch.randn(n, k, generator=g))
    assert q.qweight.shape[1] >= k          # K padded to 16: the kernel must ignore the pad columns
    q.qweight[:, k:] = 99                    # garbage in the pad must not leak into the sums
    x = torch.randn(b, k, generator=g)
    y = ck.gemv_int8(OPS, x, q.qweight, q.scales, q.in_features)
    _assert_within_q8_bound(y, x, q.qweight[:, :k], q.scales)


def _assert_within_q8_bound(y, x, qw, scales):
    """gemv_int8 quantizes x to int8 per block of 32 (absmax/127, llama.cpp Q8_0): each activation moves
    by at most its block's absmax/254, so |y - exact| ≤ Σ_blocks absmax/254 · Σ_block |q|·scale (+ fp32
    slack 1e-4); the columns past the last whole block run in fp32 (error 0 in the bound)."""
    k = x.shape[1]
    w = qw.double() * scales.double()[:, None]                       # [N, K]
    ref = x.double() @ w.t()
    nb = k // 32
    step = torch.zeros(x.shape, dtype=torch.float64)                 # [B, K] max rounding step per activation
    if nb:
        amax = x[:, : nb * 32].double().abs().view(x.shape[0], nb, 32).amax(-1)
        step[:, : nb * 32] = (amax / 254).repeat_interleave(32, dim=1)
    bound = step @ w.abs().t() + 1e-4
    assert y.shape == ref.shape and y.dtype == torch.float32
    assert bool(((y.double() - ref).abs() <= bound).all()), float(((y.double() - ref).abs() - bound).max())


@needs_ops
@pytest.mark.parametrize("n,k,b", [(2048, 384, 1), (384, 1024, 5), (33, 41, 2), (640, 384, 64), (33, 41, 17),
                                   (32000, 384, 33), (384, 1024, 3), (640, 384, 6), (35, 41, 7)])
def test_gemv_int8_is_the_q8_0_product(n, k, b, threads):
    """(32000, 384) spans several of the kernel's 192 KiB weight panels per thread; 17 and 33 rows
    end in a partial group of 4 (the kernel runs activation rows in groups of 4, then 1-3: 3, 6 and 7
    rows reach its 3- and 2-row passes, 35 weight rows its rows past the last whole step of 4 streams)."""
    # The kernel's sums are llama.cpp's Q8_0 x int8 product: x rounded per block of 32 to
    # absmax/127 steps (round half to even), summed exactly, then scaled; tail columns in fp32.
    g = _g(n + k + b + 11)
    q = quantize_per_channel(torch.randn(n, k, generator=g))
    x = torch.randn(b, k, generator=g)
    nb = k // 32
    xe = x.double().clone()
    if nb:
        blocks = x[:, : nb * 32].view(b, nb, 32)
        d = blocks.abs().amax(-1, keepdim=True) / 127
        xq = torch.round(blocks / torch.where(d > 0, d, torch.ones_like(d)))
        xe[:, : nb * 32] = (xq.double() * d.double()).view(b, nb * 32)
    w = q.qweight[:, :k].double() * q.scales.double()[:, None]
    y = ck.gemv_int8(OPS, x, q.qweight, q.scales, q.in_features).double()
    emulated, exact = xe @ w.t(), x.double() @ w.t()
    torch.testing.assert_close(y, emulated, rtol=1e-5, atol=1e-4)
    if nb:
        assert (y - exact).abs().max() > 10 * (y - emulated).abs().max()   # not the fp32-activation product


@needs_ops
@pytest.mark.parametrize("b", [1, 2, 3, 4, 5, 8, 13, 16, 33, 64])
@pytest.mark.parametrize("n,k", [(64, 384), (41, 1024), (8, 32)])
def test_gemv_int8_integer_sums_are_exact(n, k, b, threads):
    """Activations that are already int8 steps (every block of 32 holds ±127 with unit scales) make the kernel's
    product an integer sum of int8 x int8 products, exact in fp32 here (|y| <= 1024 * 127 * 127 < 2**24): every
    path (1-3 rows, the 4-row interleaved one with or without VNNI's biased weights, the last 1-7 weight rows)
    must return x @ w.T exactly, the ±127 and -128 corners included (-128 only in the weight: the quantizer never
    writes it, a foreign Q8_0 file could)."""
    g = _g(n * 3 + k + b)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    w[0, :] = 127
    w[1 % n, :] = -128
    x = torch.randint(-127, 128, (b, k), generator=g).float()
    x[:, ::32] = 127.0          # each block's absmax is 127: the block scale is exactly 1
    x[0, 1::32] = -127.0
    y = ck.gemv_int8(OPS, x, w.contiguous(), torch.ones(n), k)
    assert torch.equal(y, (x.double() @ w.double().t()).float())


@needs_ops
@pytest.mark.parametrize("t,d", [(1, 384), (4, 384), (37, 64), (3, 13)])
def test_rms_norm_matches_torch(t, d):
    g = _g(t + d)
    x = torch.randn(t, d, generator=g) * 3
    w = torch.randn(d, generator=g)
    ref = torch.nn.functional.rms_norm(x, (d,), w, 1e-5)
    torch.testing.assert_close(ck.rms_norm(OPS, x, w, 1e-5), ref, rtol=1e-6, atol=1e-6)


@needs_ops
@pytest.mark.parametrize("t,h", [(1, 1024), (5, 172), (2, 3)])
def test_silu_mul_matches_torch(t, h):
    gu = torch.randn(t, 2 * h, generator=_g(h)) * 4
    gu[0, 0], gu[0, 1] = -200.0, 200.0       # exp overflow / underflow ends
    ref = torch.nn.functional.silu(gu[:, :h]) * gu[:, h:]
    torch.testing.assert_close(ck.silu_mul(OPS, gu), ref, rtol=1e-6, atol=1e-6)


@needs_ops
def test_bad_inputs_raise_not_crash():
    w = torch.randn(8, 16)
    with pytest.raises(RuntimeError, match="batch must be 1..64"):
        OPS.gemv_f32(torch.randn(65, 16), w)
    with pytest.raises(RuntimeError, match="features"):
        OPS.gemv_f32(torch.randn(1, 15), w)
    with pytest.raises(RuntimeError, match="contiguous"):
        OPS.gemv_f32(torch.randn(16, 1).t(), w.t())
    with pytest.raises(RuntimeError, match="even"):
        OPS.silu_mul(torch.randn(1, 3))


def _onednn(monkeypatch, on: bool) -> None:
    """oneDNN's GEMM on (where this torch has it: else the test is skipped; for products of any size) or off
    for this test."""
    monkeypatch.setenv(onednn.ENV, "1" if on else "0")
    monkeypatch.setattr(onednn, "MIN_FLOPS", 0)
    onednn.linear_op.cache_clear()
    monkeypatch.setattr(onednn, "linear_op", functools.cache(onednn.linear_op.__wrapped__))
    if on and not onednn.available():
        pytest.skip("this torch has no usable oneDNN")


@needs_ops
@pytest.mark.parametrize("nthreads,use_onednn,kernel_rows", [(1, False, [1, 8]), (2, False, [1, 8, 9, 16]),
                                                             (1, True, [1, 8]), (2, True, [1, 8])])
def test_linear_chooses_the_out_in_layout_and_uses_the_kernel_for_small_batches(monkeypatch, nthreads, use_onednn,
                                                                                kernel_rows):
    """Up to MAX_BATCH rows at 1 thread and MAX_BATCH_MT at 2 (cpu_kernels.f32_kernel_wins) run gemv_f32 beside
    MKL's GEMM; beside oneDNN's (engine.onednn), up to onednn.GEMV_MAX_ROWS (8) at any thread count."""
    _onednn(monkeypatch, use_onednn)
    monkeypatch.setattr(torch, "get_num_threads", lambda: nthreads)
    g = _g(1)
    w = torch.randn(96, 40, generator=g)
    lin = Linear(w)
    assert lin.layout == "out_in" and lin.weight.shape == (96, 40) and lin.weight.is_contiguous()
    assert torch.equal(lin.weight_t, w.t())
    calls = []
    real = ck.gemv_f32
    monkeypatch.setattr(ck, "gemv_f32", lambda *a: calls.append(a[1].shape[0]) or real(*a))
    for b in (1, 8, 9, 16, 17, 64):
        x = torch.randn(b, 40, generator=g)
        torch.testing.assert_close(lin(x), x @ w.t(), rtol=1e-5, atol=1e-4)
    assert calls == kernel_rows              # the other rows: torch's GEMM on the same weight
    assert torch.equal(lin.out_rows(torch.tensor([3, 0])), w[[3, 0]])


@needs_ops
def test_linear_int8_round_trip_is_bit_identical_and_int8_uses_the_kernel(monkeypatch):
    lin = Linear(torch.randn(64, 48, generator=_g(2)))
    before = lin.weight.clone()
    x = torch.randn(1, 48, generator=_g(3))
    y_full = lin(x)
    full = lin.quantize_()
    calls = []
    real = ck.gemv_int8
    monkeypatch.setattr(ck, "gemv_int8", lambda *a: calls.append(1) or real(*a))
    _assert_within_q8_bound(lin(x), x, lin.q.qweight[:, :48], lin.q.scales)
    assert calls == [1] and lin.weight is None and lin.weight_t is None
    lin.restore_(full)
    assert torch.equal(lin.weight, before) and torch.equal(lin(x), y_full)


@needs_ops
def test_int8_linear_takes_the_kernel_at_any_row_count(monkeypatch):
    """9..64 rows (batch-32 decode steps, short prefills) run gemv_int8 in one call, more rows (long
    prefills, through quant.int8_matmul) in calls of 64, never the bf16-activation torch kernel
    (emulated without bf16 hardware: 2.5-8x the CPU time, docs/performance.md); with the kernels
    switched off, more than 64 rows take that torch kernel again."""
    lin = Linear(torch.randn(80, 48, generator=_g(7)))
    lin.quantize_()
    calls = []
    real = ck.gemv_int8
    monkeypatch.setattr(ck, "gemv_int8", lambda *a: calls.append(a[1].shape[0]) or real(*a))
    deq = lin.q.dequantize()
    for b in (9, 32, ck.MAX_BATCH_INT8):
        x = torch.randn(b, 48, generator=_g(b))
        _assert_within_q8_bound(lin(x), x, lin.q.qweight[:, :48], lin.q.scales)
    x = torch.randn(2 * ck.MAX_BATCH_INT8 + 3, 48, generator=_g(8))
    y = lin(x)
    _assert_within_q8_bound(y, x, lin.q.qweight[:, :48], lin.q.scales)
    assert calls == [9, 32, ck.MAX_BATCH_INT8, ck.MAX_BATCH_INT8, ck.MAX_BATCH_INT8, 3]
    rows = torch.cat([ck.gemv_int8(OPS, x[i:i + 8], lin.q.qweight, lin.q.scales, 48) for i in range(0, 128, 8)])
    assert torch.equal(y[:128], rows)    # in calls of >= 4 rows (the interleaved kernel) a row's value is its call's
    monkeypatch.setenv(ck.ENV, "0")
    calls.clear()
    torch.testing.assert_close(lin(x[:65]), x[:65] @ deq.t(), rtol=2e-2, atol=0.1)   # bf16 activations: ~2^-8 relative
    assert calls == []


def test_env_switch_keeps_plain_torch(monkeypatch):
    monkeypatch.setenv(ck.ENV, "0")
    assert ck.ops_for("cpu", torch.float32) is None
    lin = Linear(torch.randn(16, 8))
    assert lin.layout == "in_out" and lin.weight.shape == (8, 16)
    monkeypatch.setenv(ck.ENV, "OFF")
    assert not ck.enabled()
    monkeypatch.setenv(ck.ENV, "1")
    assert ck.enabled()


def test_non_cpu_or_non_fp32_never_uses_the_kernels():
    assert ck.ops_for("cpu", torch.bfloat16) is None
    assert ck.ops_for("meta", torch.float32) is None
    lin = Linear(torch.randn(16, 8, dtype=torch.bfloat16))
    assert lin.layout == "in_out"


def test_failed_build_falls_back_with_one_warning(monkeypatch, caplog):
    import torch.utils.cpp_extension as cpp

    def broken_load(*a, **k):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(cpp, "load", broken_load)
    monkeypatch.setenv(ck.ENV, "1")
    ck.load_ops.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="inferctl.engine.cpu_kernels"):
            assert ck.ops_for("cpu", torch.float32) is None
            assert ck.ops_for("cpu", torch.float32) is None     # cached: one attempt, one warning
            lin = Linear(torch.randn(16, 8, generator=_g(4)))
        warnings = [r for r in caplog.records if r.name == "inferctl.engine.cpu_kernels"]
        assert len(warnings) == 1 and "Ninja is required" in warnings[0].getMessage()
        assert lin.layout == "in_out"
        x = torch.randn(2, 8)
        assert torch.equal(lin(x), x @ lin.weight)
        # the fused ops fall back to torch's formulas when no ops are given
        gu = torch.randn(2, 6)
        assert torch.equal(ck.silu_mul(None, gu), torch.nn.functional.silu(gu[:, :3]) * gu[:, 3:])
        w = torch.randn(6)
        assert torch.equal(ck.rms_norm(None, gu, w, 1e-5), torch.nn.functional.rms_norm(gu, (6,), w, 1e-5))
    finally:
        ck.load_ops.cache_clear()            # the next caller loads the real (cached) build again


@needs_ops
def test_a_weight_over_the_gemv_limit_keeps_the_torch_layout_but_int8_still_uses_the_kernel(monkeypatch):
    monkeypatch.setattr(ck, "GEMV_F32_MAX_BYTES", 64 * 32 * 4)   # a 64×32 fp32 weight is "big" now
    w = torch.randn(64, 32, generator=_g(5))
    big, small = Linear(w), Linear(w[:63].contiguous())
    assert big.layout == "in_out" and big.weight.shape == (32, 64) and small.layout == "out_in"
    x = torch.randn(1, 32, generator=_g(6))
    torch.testing.assert_close(big(x), x @ w.t(), rtol=1e-5, atol=1e-4)
    assert torch.equal(big.out_rows(torch.tensor([5])), w[[5]])
    big.quantize_()
    calls = []
    real = ck.gemv_int8
    monkeypatch.setattr(ck, "gemv_int8", lambda *a: calls.append(1) or real(*a))
    big(x)
    assert calls == [1]


@needs_ops
@pytest.mark.parametrize("nthreads", [1, 2])
def test_the_ops_run_on_torchs_threads(nthreads):
    """The extension is built with OpenMP (ck.CFLAGS): at::parallel_for spreads its chunks over
    torch.get_num_threads() threads. Built without it (waves 4-6) every op ran on one thread: 1 here."""
    before = torch.get_num_threads()
    torch.set_num_threads(nthreads)
    try:
        assert OPS.parallel_threads(8) == nthreads
        assert OPS.parallel_threads(1) == 1
    finally:
        torch.set_num_threads(before)


@needs_ops
def test_a_dram_sized_fp32_weight_takes_the_gemv_up_to_64_rows(monkeypatch):
    """A weight of GEMV_F32_ALL_ROWS_BYTES or more (the classifier: 384x32000 fp32 is 49 MB) keeps the
    [out, in] layout and runs gemv_f32 up to MAX_DECODE_BATCH rows at any thread count; a layer-sized
    one only up to MAX_BATCH (1 thread). Rows past 64 take torch's GEMM on the same weight. (MKL's rules:
    beside oneDNN's GEMM every weight takes the gemv up to 6 rows, tests/unit/test_onednn.py.)"""
    _onednn(monkeypatch, False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(ck, "GEMV_F32_ALL_ROWS_BYTES", 48 * 40 * 4)    # a 48x40 fp32 weight counts as big
    assert ck.f32_kernel_wins(64, 48 * 40 * 4) and not ck.f32_kernel_wins(65, 48 * 40 * 4)
    assert ck.f32_kernel_wins(8) and not ck.f32_kernel_wins(9, 47 * 40 * 4)
    w = torch.randn(48, 40, generator=_g(7))
    lin = Linear(w)
    assert lin.layout == "out_in"
    calls = []
    real = ck.gemv_f32
    monkeypatch.setattr(ck, "gemv_f32", lambda *a: calls.append(a[1].shape[0]) or real(*a))
    for b in (1, 9, 33, 64, 65):
        x = torch.randn(b, 40, generator=_g(b))
        torch.testing.assert_close(lin(x), x @ w.t(), rtol=1e-5, atol=1e-4)
    assert calls == [1, 9, 33, 64]
