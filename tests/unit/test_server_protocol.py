"""inferctl.contract.openai (+ errors, the engine's chat template and length checks): request validation
policy, error shape, chat template (no engine needed)."""

from __future__ import annotations

import pytest

from inferctl.contract.errors import APIError, loc_to_param
from inferctl.contract.openai import ChatCompletionRequest, CompletionRequest, ProtocolLimits, validate_model
from inferctl.engine.chat_template import render_chat_prompt
from inferctl.engine.entrypoints.checks import check_max_tokens, check_prompt_length


def _err(cls, body, limits=None) -> APIError:
    with pytest.raises(APIError) as info:
        validate_model(cls, body, limits)
    err = info.value
    assert err.status == 400
    doc = err.body()["error"]
    assert set(doc) == {"message", "type", "param", "code"}
    assert doc["type"] == "invalid_request_error"
    return err


# F16: odd max_tokens values — strings are not coerced, integral floats are integers.
@pytest.mark.parametrize("value, words", [
    (-186, "greater than or equal to 1"),
    (-1, "greater than or equal to 1"),
    (0, "greater than or equal to 1"),
    ("20", "not coerced"),
    (20.5, "integer"),
    (True, "boolean"),
    (None, None),
])
def test_max_tokens_type_and_lower_bound(value, words):
    if value is None:  # null = default
        assert validate_model(CompletionRequest, {"prompt": "x", "max_tokens": None}).max_tokens is None
        return
    err = _err(CompletionRequest, {"prompt": "x", "max_tokens": value})
    assert err.param == "max_tokens"
    assert words in err.message
    assert err.message.startswith("max_tokens:")


def test_integral_float_is_an_integer_then_bounded_by_context():
    req = validate_model(CompletionRequest, {"prompt": "x", "max_tokens": 1e12})
    assert req.max_tokens == 10**12 and isinstance(req.max_tokens, int)
    with pytest.raises(APIError) as info:
        check_max_tokens(req.max_tokens, 5, 512)
    err = info.value
    assert err.status == 400 and err.param == "max_tokens" and err.code == "context_length_exceeded"
    assert "507 = max_model_len 512 - prompt 5" in err.message
    assert "1000000000000" in err.message
    check_max_tokens(507, 5, 512)  # exactly the room left is fine


def test_prompt_length_limit_names_numbers():
    check_prompt_length(511, 512)
    with pytest.raises(APIError) as info:
        check_prompt_length(512, 512)
    assert info.value.param == "prompt"
    assert "512 tokens" in info.value.message and "at most 511" in info.value.message


# F17: empty prompts are refused (policy).
@pytest.mark.parametrize("prompt", ["", [""], [], [[]], ["ok", ""], [[1, 2], []]])
def test_empty_prompts_are_400(prompt):
    err = _err(CompletionRequest, {"prompt": prompt})
    assert err.param == "prompt" and err.code == "empty_prompt"


def test_missing_prompt_is_400():
    err = _err(CompletionRequest, {"max_tokens": 3})
    assert err.param == "prompt"


@pytest.mark.parametrize("prompt, expected", [
    ("hello", ["hello"]),
    (["a", "b"], ["a", "b"]),
    ([1, 2, 3], [[1, 2, 3]]),
    ([[1, 2], [3]], [[1, 2], [3]]),
])
def test_prompt_forms_normalize(prompt, expected):
    assert validate_model(CompletionRequest, {"prompt": prompt}).prompts() == expected


@pytest.mark.parametrize("prompt, code", [
    (["a", 1], "prompt_type"),
    ([1, "a"], "prompt_type"),
    ([1, -2], "invalid_token_id"),
    ([True, 1], "prompt_type"),
    ({"text": "x"}, "prompt_type"),
    (5, "prompt_type"),
])
def test_bad_prompt_shapes(prompt, code):
    err = _err(CompletionRequest, {"prompt": prompt})
    assert err.param == "prompt" and err.code == code


def test_batch_limit_is_configurable():
    limits = ProtocolLimits(max_batch_prompts=2)
    assert len(validate_model(CompletionRequest, {"prompt": ["a", "b"]}, limits).prompts()) == 2
    err = _err(CompletionRequest, {"prompt": ["a", "b", "c"]}, limits)
    assert "at most 2 prompts" in err.message and "got 3" in err.message


@pytest.mark.parametrize("field, value, words", [
    ("temperature", 2.5, "less than or equal to 2"),
    ("temperature", -0.1, "greater than or equal to 0"),
    ("temperature", "0.5", "not coerced"),
    ("top_p", 0, "greater than 0"),
    ("top_p", 1.5, "less than or equal to 1"),
    ("top_k", -2, "greater than or equal to -1"),
    ("top_k", 2.5, "integer"),
    ("logprobs", 6, "between 0 and 5"),
    ("logprobs", -1, "greater than or equal to 0"),
    ("n", 17, "between 1 and 16"),
    ("n", 0, "between 1 and 16"),
    ("best_of", 3, "best_of=1"),
    ("stream", "true", "valid boolean"),
    ("stream", 1, "valid boolean"),
    ("echo", "yes", "valid boolean"),
    ("seed", "7", "not coerced"),
    ("seed", 2**64, "less than or equal to"),
    ("stop", 5, "string or a list of strings"),
    ("stop", [""], "empty"),
    ("stop", ["x"] * 17, "at most 16 stop sequences"),
    ("stop", "y" * 257, "at most 256 characters"),
    ("repetition_penalty", 0, "greater than 0"),
    ("presence_penalty", 3, "less than or equal to 2"),
    ("frequency_penalty", -3, "greater than or equal to -2"),
    ("model", 7, "valid string"),
    ("user", 7, "valid string"),
    ("suffix", "tail", "not supported"),
    ("logit_bias", {"5": 10}, "not supported"),
    ("ignore_eos", "no", "valid boolean"),
    ("stream_options", {"include_usage": True}, "only allowed with stream=true"),
])
def test_completion_field_errors_name_the_field(field, value, words):
    err = _err(CompletionRequest, {"prompt": "x", field: value})
    assert err.param == field
    assert words in err.message, err.message


def test_nan_and_infinity_are_refused():
    err = _err(CompletionRequest, {"prompt": "x", "temperature": float("nan")})
    assert err.param == "temperature" and "finite" in err.message
    err = _err(CompletionRequest, {"prompt": "x", "max_tokens": float("inf")})
    assert err.param == "max_tokens"


def test_unknown_fields_are_ignored_and_zero_penalties_accepted():
    req = validate_model(CompletionRequest, {"prompt": "x", "metadata": {"a": 1}, "store": True,
                                             "presence_penalty": 0, "frequency_penalty": 0.5})
    assert req.prompts() == ["x"] and req.frequency_penalty == 0.5


def test_body_must_be_an_object():
    with pytest.raises(APIError) as info:
        validate_model(CompletionRequest, ["prompt", "x"])
    assert info.value.status == 400 and "JSON object" in info.value.message


# chat
@pytest.mark.parametrize("body, param, code", [
    ({"messages": []}, "messages", "empty_messages"),
    ({"messages": [{"role": "user", "content": ""}]}, "messages", "empty_prompt"),
    ({}, "messages", "missing"),
    ({"messages": "hi"}, "messages", "list_type"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "literal_error"),
    ({"messages": [{"content": "x"}]}, "messages[0].role", "missing"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "content_type"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content", "unsupported_content"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs", "invalid_top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs",
     "out_of_range"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, "logprobs", "bool_type"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "max_completion_tokens",
     "greater_than_equal"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools",
     "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
     "response_format", "unsupported_parameter"),
])
def test_chat_errors(body, param, code):
    err = _err(ChatCompletionRequest, body)
    assert err.param == param and err.code == code, err.message


def test_chat_max_completion_tokens_wins():
    req = validate_model(ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}],
                                                 "max_tokens": 9, "max_completion_tokens": 4})
    assert req.effective_max_tokens() == 4 and req.max_tokens_param() == "max_completion_tokens"
    req = validate_model(ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 9})
    assert req.effective_max_tokens() == 9 and req.max_tokens_param() == "max_tokens"


def test_chat_templates():
    req = validate_model(ChatCompletionRequest, {"messages": [
        {"role": "system", "content": "Tell a story."},
        {"role": "user", "content": [{"type": "text", "text": "Once upon"}, {"type": "text", "text": " a time"}]},
        {"role": "assistant", "content": None},
    ]})
    assert render_chat_prompt(req.messages) == "Tell a story.\nOnce upon a time"
    assert render_chat_prompt(req.messages, "roles") == (
        "System: Tell a story.\nUser: Once upon a time\nAssistant: \nAssistant:")
    with pytest.raises(ValueError, match="unknown chat template"):
        render_chat_prompt(req.messages, "chatml")


def test_single_user_message_is_the_prompt():
    req = validate_model(ChatCompletionRequest, {"messages": [{"role": "user", "content": "Once upon a time"}]})
    assert render_chat_prompt(req.messages) == "Once upon a time"


def test_loc_to_param():
    assert loc_to_param(("messages", 0, "content")) == "messages[0].content"
    assert loc_to_param(()) is None
