"""bench.peer helpers: the greedy-agreement count, the near-tie rule, the q/k row permutation."""

from __future__ import annotations

import numpy as np

from bench import peer


def test_agree_is_the_common_prefix():
    assert peer._agree([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert peer._agree([1, 2], [1, 2, 3]) == 2
    assert peer._agree([], [1]) == 0


def test_near_tie_only_below_the_gap(monkeypatch):
    monkeypatch.setattr(peer, "_top2_gap", lambda model, ids: 2.1e-4)
    assert "near-tie at token 3" in peer._near_tie(None, [5, 6], [7, 8, 9, 10], 3)
    monkeypatch.setattr(peer, "_top2_gap", lambda model, ids: 0.5)
    assert peer._near_tie(None, [5, 6], [7, 8, 9, 10], 3) is None
    monkeypatch.setattr(peer, "_top2_gap", lambda model, ids: None)     # could not check: a mismatch
    assert peer._near_tie(None, [5], [7], 0) is None


def test_permute_half_to_interleaved_pairs_rows():
    # one head of dim 4: rotate-half rows (0, 1 | 2, 3) pair i with i + 2; interleaved wants (0, 2, 1, 3)
    w = np.arange(8, dtype=np.float32).reshape(4, 2)
    out = peer._permute_half_to_interleaved(w, 1)
    assert out[:, 0].tolist() == [0.0, 4.0, 2.0, 6.0]


def test_fractions_name_agreeing_of_compared_tokens():
    # a request whose max_tokens (27) is under 64 compares 27 tokens: "27/27", not "27/64"
    assert peer._fractions([27, 60], [27, 64]) == "27/27, 60/64"


class _Stop(Exception):
    pass


def _fake_llama_cpp(seen: dict):
    import types

    defaults = dict(type_k=1, type_v=1, flash_attn_type=-1, kv_unified=True, no_perf=False)   # llama.h defaults

    def init_from_model(model, cp):
        seen.update(type_k=cp.type_k, type_v=cp.type_v, flash_attn_type=cp.flash_attn_type)
        raise _Stop

    return types.SimpleNamespace(
        llama_backend_init=lambda: None, llama_model_default_params=lambda: None,
        llama_model_load_from_file=lambda path, params: 1, llama_model_get_vocab=lambda model: 1,
        llama_vocab_n_tokens=lambda vocab: 8, llama_init_from_model=init_from_model,
        llama_context_default_params=lambda: types.SimpleNamespace(**defaults))


def _context_params(monkeypatch, **job) -> dict:
    seen: dict = {}
    monkeypatch.setitem(__import__("sys").modules, "llama_cpp", _fake_llama_cpp(seen))
    try:
        peer._worker({"gguf": "x.gguf", "mode": "decode", "requests": [{"prompt": [3], "max_tokens": 1}],
                      "threads": 1, **job})
    except _Stop:
        pass
    return seen


def test_worker_runs_llama_cpp_attention_in_fp32_by_default(monkeypatch):
    # llama.cpp's defaults (K/V f16, flash attention auto → f16 K/V even from an f32 cache) moved stories260K's
    # logits by up to 4e-2 and split the greedy tokens at token 100; the peer must match the engine's fp32
    assert _context_params(monkeypatch) == {"type_k": 0, "type_v": 0, "flash_attn_type": 0}
    assert _context_params(monkeypatch, attention="fp32") == {"type_k": 0, "type_v": 0, "flash_attn_type": 0}


def test_worker_keeps_llama_cpp_defaults_when_asked(monkeypatch):
    assert _context_params(monkeypatch, attention="default") == {"type_k": 1, "type_v": 1, "flash_attn_type": -1}
