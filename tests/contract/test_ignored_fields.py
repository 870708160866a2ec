"""Request fields this engine does not declare (e.g. vLLM's ``min_p``, ``min_tokens``) are ignored,
as OpenAI-compatible servers do, but never silently: the first request with a given set of them
logs a WARNING naming them (and its request id), later ones DEBUG (engine/entrypoints/serving.py)."""

from __future__ import annotations

import logging

from inferctl.contract.openai import ChatCompletionRequest, CompletionRequest
from inferctl.engine.entrypoints.serving import ignored_fields
from tests.server_helpers import http_post, stories_app_fixture

app = stories_app_fixture

LOGGER = "inferctl.engine.entrypoints.serving"


def test_ignored_fields_are_the_undeclared_top_level_names():
    body = {"model": "m", "prompt": "x", "max_tokens": 3, "min_p": 0.5, "min_tokens": 2, "temperature": 0}
    assert ignored_fields(CompletionRequest, body) == ("min_p", "min_tokens")
    chat = {"model": "m", "messages": [], "max_completion_tokens": 3, "zz": 1}
    assert ignored_fields(ChatCompletionRequest, chat) == ("zz",)


def test_a_request_with_ignored_fields_is_served_and_named_once_as_a_warning(app, caplog):
    body = {"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0, "min_p": 0.9, "min_tokens": 2}
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        first = http_post(app, "/v1/completions", body, headers={"x-request-id": "req-ignored-1"})
        second = http_post(app, "/v1/completions", body, headers={"x-request-id": "req-ignored-2"})
        plain = http_post(app, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 3,
                                                   "temperature": 0})
    assert first.status_code == second.status_code == plain.status_code == 200, first.text
    # ignored means ignored: the same greedy text as the request without them
    assert first.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
    recs = [r for r in caplog.records if r.name == LOGGER and "ignored" in r.getMessage()]
    assert [r.levelno for r in recs] == [logging.WARNING, logging.DEBUG]
    assert "req-ignored-1" in recs[0].getMessage() and "min_p, min_tokens" in recs[0].getMessage()
    assert "req-ignored-2" in recs[1].getMessage()


def test_ignored_fields_inside_stream_options_are_named_with_their_parent():
    body = {"prompt": "x", "stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False},
            "min_p": 0.1}
    assert ignored_fields(CompletionRequest, body) == ("min_p", "stream_options.include_obfuscation")
    chat = {"messages": [{"role": "user", "content": "hi", "zz": 1}], "stream_options": {"zz": 1}}
    assert ignored_fields(ChatCompletionRequest, chat) == ("stream_options.zz",)
    assert ignored_fields(CompletionRequest, {"prompt": "x", "stream_options": None}) == ()
