"""``max_model_len`` above the model's own maximum (llama2.c ``seq_len``, HF
``max_position_embeddings``, GGUF ``context_length``) is refused when the config is resolved,
unless ``allow_long_max_model_len`` (``--allow-long-max-model-len`` /
``INFERCTL_ALLOW_LONG_MAX_MODEL_LEN=1``, vLLM's ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``) says so
(hostile-input E2: 10^23 was accepted and requests ran past stories260K's 512 positions)."""

from __future__ import annotations

import pytest

from inferctl.engine.config import ConfigError, EngineConfig


def test_above_the_models_maximum_is_refused_naming_the_limit_and_the_override():
    with pytest.raises(ConfigError) as e:
        EngineConfig(max_model_len=10**23, device="cpu").resolve(512)
    msg = str(e.value)
    assert e.value.field == "max_model_len" and msg.startswith("max_model_len: 100000000000000000000000 ")
    assert "model's maximum of 512 tokens" in msg
    assert "--allow-long-max-model-len" in msg and "INFERCTL_ALLOW_LONG_MAX_MODEL_LEN=1" in msg
    with pytest.raises(ConfigError):
        EngineConfig(max_model_len=513, device="cpu").resolve(512)


def test_up_to_the_maximum_or_with_the_override_resolves():
    assert EngineConfig(max_model_len=512, device="cpu").resolve(512).max_model_len == 512
    assert EngineConfig(max_model_len=100, device="cpu").resolve(512).max_model_len == 100
    assert EngineConfig(device="cpu").resolve(512).max_model_len == 512
    cfg = EngineConfig(max_model_len=2048, device="cpu", allow_long_max_model_len=True).resolve(512)
    assert cfg.max_model_len == 2048


def test_the_override_must_be_a_bool():
    with pytest.raises(ConfigError) as e:
        EngineConfig(allow_long_max_model_len="no")
    assert e.value.field == "allow_long_max_model_len"
