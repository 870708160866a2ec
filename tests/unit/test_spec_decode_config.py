"""--speculative-config parsing: vLLM's keys, limits named in the errors."""

from __future__ import annotations

import pytest

from inferctl.engine.config import ConfigError, EngineConfig
from inferctl.contract.speculative import SpeculativeConfig, SpeculativeConfigError, parse_speculative_config


def test_ngram_config_parses_with_defaults():
    cfg = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}')
    assert cfg == SpeculativeConfig("ngram", 4, 3, 1, None)
    assert parse_speculative_config(None) is None
    assert parse_speculative_config("") is None


def test_engine_config_validates_it():
    cfg = EngineConfig(speculative_config={"method": "int8_self", "num_speculative_tokens": 2})
    assert cfg.speculative_config == SpeculativeConfig("int8_self", 2)
    assert EngineConfig().speculative_config is None


@pytest.mark.parametrize("value, field, text", [
    ('{"method": "eagle", "num_speculative_tokens": 2}', "speculative_config.method", "ngram, draft_model"),
    ('{"method": "ngram", "num_speculative_tokens": 17}', "speculative_config.num_speculative_tokens", "1..16"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "speculative_config.num_speculative_tokens", "1..16"),
    ('{"method": "ngram"}', "speculative_config.num_speculative_tokens", "required"),
    ('{"method": "ngram", "num_speculative_tokens": true}', "speculative_config.num_speculative_tokens", "integer"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 40}',
     "speculative_config.prompt_lookup_max", "1..32"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, "prompt_lookup_min": 3}',
     "speculative_config.prompt_lookup_min", "<= prompt_lookup_max"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "temperature": 1}', "speculative_config.temperature",
     "unknown key"),
    ('{"method": "draft_model", "num_speculative_tokens": 2}', "speculative_config.model", "required"),
    ('{"method": "int8_self", "num_speculative_tokens": 2, "model": "x"}', "speculative_config.model",
     "draft_model only"),
    ('{"method": "int8_self", "num_speculative_tokens": 2, "prompt_lookup_max": 2}',
     "speculative_config.prompt_lookup_max", "ngram only"),
    ("[1, 2]", "speculative_config", "JSON object"),
    ("{method: ngram}", "speculative_config", "JSON object"),
])
def test_bad_values_are_refused_naming_the_key(value, field, text):
    with pytest.raises(SpeculativeConfigError) as info:
        parse_speculative_config(value)
    assert info.value.field == field
    assert text in str(info.value)
    with pytest.raises(ConfigError) as info:    # the engine's config error, same field
        EngineConfig(speculative_config=value)
    assert info.value.field == field


def test_controller_launch_key_is_checked_at_load_and_passed_as_the_flag():
    from pydantic import ValidationError

    from inferctl.controller.config import LaunchConfig

    cfg = {"method": "int8_self", "num_speculative_tokens": 3}
    args = LaunchConfig(speculative_config=cfg).engine_args()
    i = args.index("--speculative-config")
    assert parse_speculative_config(args[i + 1]) == SpeculativeConfig("int8_self", 3)
    assert "--speculative-config" not in LaunchConfig().engine_args()
    with pytest.raises(ValidationError, match="speculative_config.method: must be one of"):
        LaunchConfig(speculative_config={"method": "medusa", "num_speculative_tokens": 3})
