"""bench.peer against the real llama.cpp (llama-cpp-python in its venv, a subprocess): on stories260K converted to
GGUF, llama.cpp's greedy tokens equal the engine's, all 128 batch-1 decode tokens (issue 12: with llama.cpp's default
f16 attention they split at token 100, where the top-2 logit gap is 6.6e-3). Skipped where the peer venv is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import peer

pytestmark = pytest.mark.skipif(not Path(peer.PEER_PYTHON).exists(),
                                reason=f"llama-cpp-python venv not at {peer.PEER_PYTHON} (INFERCTL_PEER_PYTHON)")


def test_llama_cpp_greedy_tokens_equal_the_engines_on_stories260k(tmp_path, stories_dir):
    from bench.models import stories_hf_dir

    hf = stories_hf_dir(cache=tmp_path)
    gguf = peer.write_gguf(hf, tmp_path / "stories260K-f32.gguf", "f32")
    engine = peer.engine_decode(hf, "full", 128, 1)["tokens"]
    llama = peer.run_peer(peer.PEER_PYTHON, gguf, "decode", [{"prompt": peer.PROMPT, "max_tokens": 128}], 1)["tokens"]
    assert len(engine) == len(llama) == 128
    assert peer._agree(engine, llama) == 128
