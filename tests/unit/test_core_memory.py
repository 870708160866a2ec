"""MemoryAccountant, the simulated caching allocator, OOM messages and error classes (F13)."""

from __future__ import annotations

import pytest
import torch

from inferctl.contract.units import GiB, KiB, MiB, format_size
from inferctl.engine.allocator import SimulatedCachingAllocator
from inferctl.engine.memory import MemoryAccountant
from inferctl.engine.memory_plan import estimate_step_activation_bytes
from inferctl.engine.oom import (classify_error, classify_oom, format_oom_message, format_oom_message_old,
                                 parse_cuda_error_code, parse_oom_message)

# Field case F13: requested R, free F, allocated A, reserved-unallocated U, total T.
F13 = {
    "a": dict(R=546 * MiB, F=int(514.19 * MiB), A=int(13.73 * GiB), U=int(736.86 * MiB),
              T=int(15.77 * GiB), frag_pct=4.98, kind="fragmentation"),
    "b": dict(R=128 * MiB, F=int(100.19 * MiB), A=int(93.46 * GiB), U=int(100.28 * MiB),
              T=None, frag_pct=0.10, kind="exhaustion"),
    "c": dict(R=int(124.68 * GiB), F=None, A=int(25.50 * GiB), U=int(3.14 * GiB),
              T=int(95.22 * GiB), frag_pct=10.96, kind="impossible"),
}


def test_format_size_follows_c10_boundaries():
    assert format_size(1024) == "1024 bytes"
    assert format_size(1025) == "1.00 KiB"
    assert format_size(MiB) == "1024.00 KiB"
    assert format_size(546 * MiB) == "546.00 MiB"
    assert format_size(int(15.77 * GiB)) == "15.77 GiB"


@pytest.mark.parametrize("case", sorted(F13))
@pytest.mark.parametrize("style", ["new", "old"])
def test_f13_messages_parse_and_classify(case, style):
    c = F13[case]
    if style == "new":
        msg = format_oom_message(c["R"], c["T"], c["F"], c["A"], c["U"])
        assert "is reserved by PyTorch but unallocated" in msg
    else:
        msg = format_oom_message_old(c["R"], c["T"], c["F"], c["A"], c["A"] + c["U"])
        assert "reserved in total by PyTorch" in msg
    info = parse_oom_message(msg)
    assert info.format == style
    assert info.requested_bytes == pytest.approx(c["R"], rel=1e-3)
    assert info.allocated_bytes == pytest.approx(c["A"], rel=1e-3)
    assert info.total_bytes == (None if c["T"] is None else pytest.approx(c["T"], rel=1e-3))
    assert info.free_bytes == (None if c["F"] is None else pytest.approx(c["F"], rel=1e-3))
    if style == "new":
        assert round(100 * info.fragmentation_ratio, 2) == c["frag_pct"]
    else:   # the old format prints only "reserved in total" to 0.01 GiB, so U is coarser
        assert 100 * info.fragmentation_ratio == pytest.approx(c["frag_pct"], abs=0.01)
    assert classify_oom(info) == c["kind"]


def test_parses_real_pytorch_messages():
    # PyTorch 2.1 printed "capacty"; a multi-process line sits between the clauses.
    msg = ("CUDA out of memory. Tried to allocate 5.96 GiB. GPU 0 has a total capacty of 23.69 GiB "
           "of which 5.25 GiB is free. Process 2006998 has 256.00 MiB memory in use. Including "
           "non-PyTorch memory, this process has 18.17 GiB memory in use. Of the allocated memory "
           "17.88 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.")
    info = parse_oom_message(msg)
    assert info.total_bytes == round(23.69 * GiB)
    assert info.free_bytes == round(5.25 * GiB)
    assert info.reserved_unallocated_bytes == 0
    assert info.fragmentation_ratio == 0.0
    assert classify_oom(info) == "exhaustion"
    old = ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
           "14.56 GiB already allocated; 3.19 MiB free; 14.84 GiB reserved in total by PyTorch)")
    info = parse_oom_message(old)
    assert info.format == "old"
    assert info.reserved_unallocated_bytes == round(14.84 * GiB) - round(14.56 * GiB)
    assert classify_oom(info) == "fragmentation"   # 0.28 GiB cached >= 20 MiB asked
    with pytest.raises(ValueError, match="Tried to allocate"):
        parse_oom_message("CUDA error: out of memory")


@pytest.mark.parametrize("message,code", [
    ("CUDA error: out of memory", 2),
    ("CUDA error: operation not permitted\nCUDA kernel errors might be ...", 800),
    ("RuntimeError: cudaErrorNotPermitted", 800),
    ("CUDA error 800 at foo.cu:12", 800),
    ("CUDA error: an illegal memory access was encountered", 700),
    ("CUDA error: uncorrectable ECC error encountered", 214),
    ("something else", None),
])
def test_parse_cuda_error_code(message, code):
    assert parse_cuda_error_code(message) == code


def test_classify_error():
    codes = frozenset({2, 800})
    assert classify_error(torch.OutOfMemoryError("x"), codes) == "oom"
    assert classify_error(RuntimeError("CUDA error: out of memory"), codes) == "oom"
    assert classify_error(RuntimeError("CUDA error: operation not permitted"), codes) == "oom"
    # 800 is an OOM only because it is configured so
    assert classify_error(RuntimeError("CUDA error: operation not permitted"), frozenset({2})) == "other"
    assert classify_error(RuntimeError("CUDA error: an illegal memory access was encountered"), codes) == "hardware"
    assert classify_error(RuntimeError("CUDA error: uncorrectable ECC error encountered"), codes) == "hardware"
    assert classify_error(RuntimeError("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"),
                          codes) == "hardware"
    assert classify_error(RuntimeError("Unable to determine the device handle: GPU is lost"), codes) == "hardware"
    # a hardware error is never an int8 trigger, even if someone lists its code as OOM
    assert classify_error(RuntimeError("CUDA error 700"), frozenset({700})) == "hardware"
    assert classify_error(ValueError("bad input"), codes) == "other"


def test_allocator_caches_freed_blocks_and_empty_cache_releases():
    a = SimulatedCachingAllocator(64 * KiB)
    h1 = a.malloc(1000)                      # rounded to 1024
    assert (a.allocated, a.reserved) == (1024, 1024)
    a.free_block(h1)
    assert (a.allocated, a.reserved) == (0, 1024)     # cached, still reserved
    h2 = a.malloc(512)                       # reuses (splits) the cached segment
    assert (a.allocated, a.reserved) == (512, 1024)
    assert a.empty_cache() == 0              # the segment is partly used: cannot be released
    a.free_block(h2)
    assert a.empty_cache() == 1024
    assert a.reserved == 0


def test_allocator_fragmentation_oom():
    a = SimulatedCachingAllocator(9 * KiB)
    big = a.malloc(8 * KiB)
    a.free_block(big)
    x, y, z = a.malloc(2 * KiB), a.malloc(2 * KiB), a.malloc(2 * KiB)
    a.free_block(y)                          # holes of 2 KiB at offsets 2 KiB and 6 KiB
    assert a.reserved - a.allocated == 4 * KiB
    with pytest.raises(torch.OutOfMemoryError) as ei:
        a.malloc(3 * KiB)                    # 4 KiB cached but no 3 KiB hole; 1 KiB free
    info = ei.value.oom_info
    assert info.requested_bytes == 3 * KiB
    assert info.free_bytes == 1 * KiB
    assert info.reserved_unallocated_bytes == 4 * KiB
    assert info.total_bytes == 9 * KiB
    assert classify_oom(info) == "fragmentation"
    # the message is PyTorch's and parses back to the same numbers
    assert parse_oom_message(str(ei.value)).reserved_unallocated_bytes == 4 * KiB
    del x, z


def test_allocator_releases_cache_before_failing():
    a = SimulatedCachingAllocator(10 * KiB)
    h = a.malloc(6 * KiB)
    a.free_block(h)                          # 6 KiB cached
    h2 = a.malloc(8 * KiB)                   # does not fit beside it: the cache is released first
    assert a.reserved == 8 * KiB and a.allocated == 8 * KiB
    with pytest.raises(torch.OutOfMemoryError) as ei:
        a.malloc(4 * KiB)
    assert classify_oom(ei.value.oom_info) == "exhaustion"
    with pytest.raises(torch.OutOfMemoryError) as ei:
        a.malloc(11 * KiB)
    assert classify_oom(ei.value.oom_info) == "impossible"
    a.free_block(h2)


def test_accountant_budget_oom_and_injection():
    acct = MemoryAccountant(100 * KiB, "cpu")
    w = acct.allocate(40 * KiB, "weights")
    acct.allocate(30 * KiB, "kv_cache")
    snap = acct.snapshot()
    assert snap["weights_bytes"] == 40 * KiB and snap["kv_pool_bytes"] == 30 * KiB
    assert snap["free_bytes"] == 30 * KiB
    h = acct.reserve_activations(20 * KiB)
    assert acct.snapshot()["activation_bytes"] == 20 * KiB
    acct.release_activations(h)
    with pytest.raises(torch.OutOfMemoryError) as ei:
        acct.reserve_activations(40 * KiB)
    err = ei.value
    assert err.oom_source == "budget"
    assert "Tried to allocate 40.00 KiB. GPU 0 has a total capacity of 100.00 KiB" in str(err)
    assert err.oom_info.allocated_bytes == 70 * KiB
    # int8 weights free budget: the same step fits once the weights shrink
    acct.free(w)
    acct.empty_cache()
    acct.allocate(10 * KiB, "weights")
    h = acct.reserve_activations(40 * KiB)
    acct.release_activations(h)
    acct.inject_oom(1)
    with pytest.raises(torch.OutOfMemoryError) as ei:
        acct.reserve_activations(1 * KiB)
    assert ei.value.oom_source == "injected"
    assert ei.value.oom_info.free_bytes == 0
    acct.release_activations(acct.reserve_activations(1 * KiB))   # only one was injected
    with pytest.raises(ValueError):
        acct.inject_oom(0)


def test_activation_estimate_is_monotone_and_documented_formula():
    dims = dict(dim=64, hidden_dim=172, n_heads=8, n_kv_heads=4, vocab_size=512, act_bytes=4)
    base = estimate_step_activation_bytes(10, 2, 10 * 100, 200, **dims)
    # formula by hand: kv_dim = 4 * 8 = 32
    by_hand = 4 * (10 * (4 * 64 + 2 * 32 + 3 * 172) + 2 * 8 * 1000 + 2 * 32 * 200) + 4 * 2 * 512
    assert base == by_hand
    assert estimate_step_activation_bytes(11, 2, 10 * 100, 200, **dims) > base
    assert estimate_step_activation_bytes(10, 2, 10 * 101, 201, **dims) > base
    assert estimate_step_activation_bytes(10, 3, 10 * 100, 200, **dims) > base


def test_cuda_oom_without_a_tried_to_allocate_clause_stays_an_oom(monkeypatch):
    # A C10_CUDA_CHECK failure raises torch.OutOfMemoryError("CUDA error: out of memory") with
    # no "Tried to allocate" clause; the reservation must still raise that OOM (source "cuda",
    # no parsed numbers), not a ValueError from the parser, which the engine would take for
    # an "other" step error and fail the step's requests with 500.
    acct = MemoryAccountant.__new__(MemoryAccountant)   # a CUDA accountant without a GPU
    acct.device, acct.is_cuda, acct.budget_bytes = torch.device("cuda", 0), True, 1 * GiB
    acct._device_index, acct._sim, acct._injected = 0, None, 0

    def cuda_oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA error: out of memory")

    monkeypatch.setattr(torch, "empty", cuda_oom)
    with pytest.raises(torch.OutOfMemoryError) as info:
        acct.reserve_activations(4 * MiB)
    assert info.value.oom_source == "cuda"
    assert getattr(info.value, "oom_info", None) is None
