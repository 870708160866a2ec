"""Weights moved into transparent huge pages at load (engine.hugepages, called by engine.loader.load_model):
same shapes, dtypes and bits, the same greedy tokens, and the INFERCTL_HUGEPAGES=0 switch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inferctl.engine import hugepages
from inferctl.engine.loader import load_model
from tests.core_helpers import drain

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _weights(model) -> dict[str, torch.Tensor]:
    return {n: lin.weight for n, lin in model._linears().items() if lin.weight is not None}


def test_on_by_default_and_bits_equal(monkeypatch):
    if not hasattr(__import__("mmap"), "MADV_HUGEPAGE"):
        pytest.skip("this platform's mmap has no MADV_HUGEPAGE (not Linux)")
    monkeypatch.delenv("INFERCTL_HUGEPAGES", raising=False)
    assert hugepages.enabled()
    moved = load_model("demo").model
    monkeypatch.setenv("INFERCTL_HUGEPAGES", "0")
    assert not hugepages.enabled()
    plain = load_model("demo").model
    a, b = _weights(moved), _weights(plain)
    assert a.keys() == b.keys() and len(a) == 1 + 4 * moved.args.n_layers
    ptrs = sorted(t.data_ptr() for t in a.values())
    for n in a:
        assert a[n].shape == b[n].shape and a[n].dtype == b[n].dtype == torch.float32
        assert a[n].is_contiguous() and a[n].data_ptr() % hugepages.WEIGHT_ALIGN == 0
        assert torch.equal(a[n].view(torch.int32), b[n].view(torch.int32)), n       # bit for bit
    # one buffer: the moved weights lie within one span no longer than their padded sizes
    total = sum(-(-t.numel() * 4 // 64) * 64 for t in a.values())
    assert ptrs[-1] - ptrs[0] < total
    assert ptrs[0] % hugepages.HUGE_PAGE_BYTES == 0


def test_off_switch_moves_nothing(monkeypatch):
    monkeypatch.setenv("INFERCTL_HUGEPAGES", "0")
    m = load_model("demo").model
    before = {n: t.data_ptr() for n, t in _weights(m).items()}
    assert hugepages.move_weights(m) == 0
    assert {n: t.data_ptr() for n, t in _weights(m).items()} == before


def test_move_weights_returns_padded_bytes(monkeypatch):
    if not hugepages.enabled():
        pytest.skip("huge pages unavailable here (not Linux or INFERCTL_HUGEPAGES=0)")
    monkeypatch.setenv("INFERCTL_HUGEPAGES", "0")
    m = load_model("demo").model
    monkeypatch.delenv("INFERCTL_HUGEPAGES")
    a = m.args
    sizes = [a.vocab_size * a.dim] + a.n_layers * [
        (a.n_heads + 2 * a.n_kv_heads) * a.head_dim * a.dim, a.n_heads * a.head_dim * a.dim,
        2 * a.hidden_dim * a.dim, a.dim * a.hidden_dim]
    assert hugepages.move_weights(m) == sum(-(-4 * s // 64) * 64 for s in sizes)


def test_huge_buffer_rejects_empty():
    with pytest.raises(ValueError):
        hugepages.huge_buffer(0)


def test_anon_huge_pages_granted():
    mode = THP.read_text() if THP.exists() else ""
    if not hugepages.enabled() or not ("[always]" in mode or "[madvise]" in mode):
        pytest.skip(f"transparent huge pages not available here (enabled: {mode.strip() or 'no sysfs file'})")
    before = hugepages.anon_huge_kb()
    if before is None:
        pytest.skip("no AnonHugePages in /proc/self/smaps_rollup")
    buf = hugepages.huge_buffer(8 * hugepages.HUGE_PAGE_BYTES)
    buf.fill_(1)
    assert hugepages.anon_huge_kb() > before
    assert int(buf.sum()) == buf.numel()


def test_same_greedy_tokens_on_and_off(monkeypatch, stories_dir):
    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.sampling_params import SamplingParams

    def tokens(flag: str) -> list[int]:
        monkeypatch.setenv("INFERCTL_HUGEPAGES", flag)
        engine = LLMEngine(load_model(str(stories_dir / "stories260K.bin")), EngineConfig())
        engine.add_request("a", list(range(3, 19)), SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
        return drain(engine)[0]["a"]

    on = tokens("1")
    assert len(on) == 12
    assert tokens("0") == on


def test_int8_and_back_keeps_the_moved_weights(monkeypatch):
    if not hugepages.enabled():
        pytest.skip("huge pages unavailable here (not Linux or INFERCTL_HUGEPAGES=0)")
    m = load_model("demo").model
    before = {n: (t.data_ptr(), t.clone()) for n, t in _weights(m).items()}
    m.set_precision("int8")
    assert not _weights(m)
    m.set_precision("full")
    after = _weights(m)
    assert after.keys() == before.keys()
    for n, (ptr, t) in before.items():
        assert after[n].data_ptr() == ptr and torch.equal(after[n], t), n
