"""Hostile input against the wave-3 features' pure parsers and checks: ``--speculative-config``
JSON nested past the parser's recursion limit, API keys no client could send."""

from __future__ import annotations

import pytest

from inferctl.contract.http import MAX_API_KEY_CHARS, check_api_key
from inferctl.contract.speculative import SpeculativeConfigError, parse_speculative_config


# ------------------------------------------------------------------ --speculative-config
@pytest.mark.parametrize("text", ["[" * 100_000, '{"method": ' * 50_000])
def test_speculative_config_nested_too_deeply_is_a_config_error(text):
    with pytest.raises(SpeculativeConfigError) as err:
        parse_speculative_config(text)
    assert err.value.field == "speculative_config" and "nested too deeply" in err.value.message


# ------------------------------------------------------------------ --api-key
@pytest.mark.parametrize("key", ["", " ", "\t\n"])
def test_empty_or_blank_api_key_is_refused(key):
    with pytest.raises(ValueError, match=r"--api-key: the API key is empty"):
        check_api_key(key, "--api-key")


@pytest.mark.parametrize("key", [" padded-key ", "two words", "s3cr3t-ключ", "tab\tkey", "nul\x00key"])
def test_api_key_a_client_cannot_send_is_refused(key):
    with pytest.raises(ValueError, match="visible ASCII only"):
        check_api_key(key, "--api-key")


def test_api_key_too_long_for_a_header_is_refused():
    with pytest.raises(ValueError, match=f"at most {MAX_API_KEY_CHARS}"):
        check_api_key("k" * (MAX_API_KEY_CHARS + 1), "--api-key")
    assert check_api_key("k" * MAX_API_KEY_CHARS, "--api-key") == "k" * MAX_API_KEY_CHARS


def test_ordinary_api_keys_pass():
    for key in ("k", "sk-abc_DEF.123~+/=", "!#$%&'*"):
        assert check_api_key(key, "--api-key") == key
