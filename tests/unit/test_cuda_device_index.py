"""``engine serve --device cuda`` (no index) on a GPU host: found on an H200 (2026-12-04), where the
engine exited at start with ``Expected a torch.device with a specified index or an integer, but
got:cuda``. ``torch.cuda.set_per_process_memory_fraction`` resolves its device with
``torch.cuda._utils._get_device_index(device)`` (no ``optional=True``), which refuses an unindexed
``cuda``; the accountant called it with the config's ``"cuda"``. This host has no GPU, so the three
``torch.cuda`` calls the accountant makes are replaced, the fraction call by one that applies
torch's own index rule to its argument."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch.cuda._utils import _get_device_index

from inferctl.contract.units import GiB
from inferctl.engine.config import EngineConfig
from inferctl.engine.memory import MemoryAccountant


def _fake_cuda(monkeypatch, current: int = 0) -> list:
    calls: list = []

    def set_fraction(fraction: float, device=None) -> None:
        calls.append((fraction, _get_device_index(device)))     # what torch does with the argument

    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: SimpleNamespace(total_memory=80 * GiB))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    return calls


def test_an_unindexed_cuda_device_becomes_the_current_one_before_the_memory_fraction_is_set(monkeypatch):
    calls = _fake_cuda(monkeypatch, current=0)
    acc = MemoryAccountant(8 * GiB, "cuda")
    assert acc.device == torch.device("cuda", 0)
    assert calls == [(0.1, 0)]


def test_the_current_device_is_the_one_taken_not_always_the_first(monkeypatch):
    calls = _fake_cuda(monkeypatch, current=3)
    acc = MemoryAccountant(20 * GiB, torch.device("cuda"))
    assert acc.device == torch.device("cuda", 3)
    assert calls == [(0.25, 3)]


def test_an_indexed_device_is_kept_and_a_budget_above_the_card_sets_no_fraction(monkeypatch):
    calls = _fake_cuda(monkeypatch, current=0)
    assert MemoryAccountant(8 * GiB, "cuda:1").device == torch.device("cuda", 1)
    assert calls == [(0.1, 1)]
    assert MemoryAccountant(100 * GiB, "cuda:1").device == torch.device("cuda", 1)
    assert len(calls) == 1


def test_a_cpu_accountant_touches_no_cuda_call(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("a CPU accountant called torch.cuda")

    monkeypatch.setattr(torch.cuda, "current_device", boom)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", boom)
    assert MemoryAccountant(1 * GiB, "cpu").device == torch.device("cpu")


def test_config_resolve_turns_cuda_into_the_models_indexed_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    cfg = EngineConfig(device="cuda").resolve(512, model_device=torch.device("cuda", 2), model_dtype=torch.bfloat16)
    assert cfg.device == "cuda:2"
    auto = EngineConfig(device="auto").resolve(512, model_device=torch.device("cuda", 0), model_dtype=torch.bfloat16)
    assert auto.device == "cuda:0"
    explicit = EngineConfig(device="cuda:1").resolve(512, model_device=torch.device("cuda", 1),
                                                      model_dtype=torch.bfloat16)
    assert explicit.device == "cuda:1"


def test_config_resolve_refuses_another_gpu_than_the_models(monkeypatch):
    import pytest

    from inferctl.engine.config import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    # the KV cache and the accountant would go to cuda:1 while the weights sit on cuda:0
    with pytest.raises(ConfigError, match="'cuda:1' asked for, but the model was loaded on 'cuda:0'"):
        EngineConfig(device="cuda:1").resolve(512, model_device=torch.device("cuda", 0), model_dtype=torch.bfloat16)
    with pytest.raises(ConfigError, match="'cpu' asked for, but the model was loaded on 'cuda:0'"):
        EngineConfig(device="cpu").resolve(512, model_device=torch.device("cuda", 0), model_dtype=torch.bfloat16)
    assert EngineConfig(device="cpu").resolve(512, model_device="cpu", model_dtype=torch.float32).device == "cpu"
