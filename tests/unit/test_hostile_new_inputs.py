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


# ------------------------------------------------------------------ router --config
def load_router(tmp_path, text: str | bytes, env: dict | None = None) -> dict:
    from inferctl.router.config import load_config_file
    p = tmp_path / "router.yaml"
    (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
    return load_config_file(str(p), env or {})


@pytest.mark.parametrize("text, says", [
    ("rate_limits:\n  default: {requests_per_minute: 5}\nrate_limits:\n  keys: []\n",
     "duplicate key 'rate_limits' at line 3"),
    ("rate_limits:\n  default: {requests_per_minute: 5, requests_per_minute: 9}\n",
     "duplicate key 'requests_per_minute' at line 2"),
    ("engines: " + "[" * 5000 + "\n", "nested too deeply to parse"),
    (b"\xff\xfe\x00garbage", "is not UTF-8 text"),
])
def test_router_config_file_that_would_lose_data_or_crash_is_refused(tmp_path, text, says):
    from inferctl.router.config import ConfigError
    with pytest.raises(ConfigError, match=says):
        load_router(tmp_path, text)


@pytest.mark.parametrize("value", ["0.5", "1e-300", "0", "-5", str(10**400), ".inf", ".nan", "'60'", "true"])
@pytest.mark.parametrize("limit", ["requests_per_minute", "tokens_per_minute"])
def test_router_rate_limit_outside_1_to_1e15_is_refused(tmp_path, limit, value):
    from inferctl.router.config import ConfigError
    with pytest.raises(ConfigError, match=rf"rate_limits\.default\.{limit}: must be (a number >= 1|at most 1e\+15)"):
        load_router(tmp_path, f"rate_limits:\n  default: {{{limit}: {value}}}\n")
    assert load_router(tmp_path, f"rate_limits:\n  default: {{{limit}: 1}}\n")["rate_default"].name == "default"


def test_router_rate_limit_of_one_per_minute_admits_a_request():
    from inferctl.router.ratelimit import KeyLimit, RateLimiter
    limiter = RateLimiter({}, KeyLimit("default", requests_per_minute=1.0), clock=lambda: 0.0)
    assert limiter.admit(None).ok and not limiter.admit(None).ok


def test_router_key_env_secret_file_newline_is_stripped_and_unsendable_keys_are_refused(tmp_path):
    from inferctl.router.config import ConfigError
    entry = "rate_limits:\n  keys:\n  - {name: a, %s, requests_per_minute: 5}\n"
    keys = load_router(tmp_path, entry % "key_env: TEAM_KEY", {"TEAM_KEY": "sk-team\n"})["rate_keys"]
    assert list(keys) == ["sk-team"]
    with pytest.raises(ConfigError, match=r"keys\[0\]\.key: the API key holds whitespace"):
        load_router(tmp_path, entry % "key: ' sk-team '")
    with pytest.raises(ConfigError, match=r"keys\[0\]\.key_env: the API key holds whitespace"):
        load_router(tmp_path, entry % "key_env: TEAM_KEY", {"TEAM_KEY": "sk team"})


def test_load_yaml_keeps_what_safe_load_keeps():
    from inferctl.contract.yamlfile import load_yaml
    assert load_yaml("a: &x {b: 1}\nc: *x\n1: i\n'1': s\n") == {"a": {"b": 1}, "c": {"b": 1}, 1: "i", "1": "s"}
    assert load_yaml("") is None
    with pytest.raises(ValueError, match="not valid YAML"):
        load_yaml("a: [\n")


# ------------------------------------------------------------------ inferctl plan
def test_plan_params_too_large_for_a_float_is_a_plan_error():
    from inferctl.tools.plan import PlanError, parse_count
    for text in ("1e400", "9e307T"):
        with pytest.raises(PlanError, match="too large to be a count"):
            parse_count(text)
    assert parse_count("1e300") == round(1e300)


DIMS = dict(params="7B", layers=32, heads=32, hidden=4096, intermediate=11008, vocab=32000)


@pytest.mark.parametrize("kv_heads", [7, 64, 33])
def test_plan_kv_heads_that_do_not_divide_heads_are_refused(kv_heads):
    from inferctl.tools.plan import PlanError, dims_from_flags
    with pytest.raises(PlanError, match=rf"must divide --heads \(32\).*got {kv_heads}"):
        dims_from_flags(**DIMS, kv_heads=kv_heads)
    assert dims_from_flags(**DIMS, kv_heads=8).kv_heads == 8


def test_plan_hidden_not_a_multiple_of_heads_is_refused_without_head_dim():
    from inferctl.tools.plan import PlanError, dims_from_flags
    with pytest.raises(PlanError, match=r"must be a multiple of --heads \(32\).*got 4001"):
        dims_from_flags(**{**DIMS, "hidden": 4001})
    assert dims_from_flags(**{**DIMS, "hidden": 4001}, head_dim=128).head_dim == 128


# ------------------------------------------------------------------ --chat-template
ECHO = "{% for m in messages %}{{ m.content }}\n{% endfor %}"


@pytest.mark.parametrize("source, says", [
    ("{% for i in range(10**9) %}x{% endfor %}", "OverflowError: Range too big"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ("{{ '' }}", "to an empty prompt"),
    ("{{ ''.__class__.__mro__ }}", "unsafe"),
])
def test_chat_template_that_fails_or_renders_nothing_is_refused_at_start(source, says):
    from inferctl.engine.chat_template import ChatTemplateError, resolve_chat_template
    with pytest.raises(ChatTemplateError, match=says) as err:
        resolve_chat_template(source)
    assert str(err.value).startswith("chat template from --chat-template: ")


def test_chat_template_error_on_some_messages_is_a_400_naming_messages():
    from inferctl.contract.errors import APIError
    from inferctl.contract.openai import ChatMessage
    from inferctl.engine.chat_template import render_chat_prompt, resolve_chat_template
    tpl = resolve_chat_template("{% for m in messages %}{% if m.content == 'boom' %}{{ 1 + 'a' }}{% endif %}"
                                "{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}")
    assert render_chat_prompt([ChatMessage(role="user", content="hi")], tpl) == "hi"
    for messages, says in (([ChatMessage(role="user", content="boom")], "TypeError: unsupported operand"),
                           ([ChatMessage(role="system", content="only a system")], "render to an empty prompt")):
        with pytest.raises(APIError) as err:
            render_chat_prompt(messages, tpl)
        assert err.value.status == 400 and err.value.param == "messages" and says in str(err.value.message)


# ------------------------------------------------------------------ controller config
@pytest.mark.parametrize("text, says", [
    ("engines: []\nengines: []\n", "duplicate key 'engines' at line 2"),
    ("engines:\n- name: a\n  launch: {model: demo, speculative_config: {method: ngram, method: int8_self}}\n",
     "duplicate key 'method' at line 3"),
    ("engines: " + "[" * 5000 + "\n", "nested too deeply to parse"),
])
def test_controller_config_with_a_duplicate_key_or_deep_nesting_is_refused(tmp_path, text, says):
    from inferctl.controller.config import ConfigError, load_config
    p = tmp_path / "inferctl.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=says):
        load_config(p)


# ------------------------------------------------------------------ router usage meter
@pytest.mark.parametrize("stream, body", [(False, b"[" * 100_000),
                                          (True, b'data: {"choices": [1]}\n\ndata: ' + b"[" * 100_000 + b"\n")])
def test_usage_meter_survives_an_upstream_body_nested_too_deeply(stream, body):
    from inferctl.router.ratelimit import UsageMeter
    meter = UsageMeter(stream)
    meter.feed(body)
    assert meter.tokens == (1 if stream else 0)
