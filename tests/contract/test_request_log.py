"""The engine's per-request log line and request id, over the real stories260K engine in-process:
one ``inferctl.engine.requests`` line per /v1 request with the client's ``X-Request-Id``, the
OpenAI id, token counts equal to the answer's ``usage``; errors with their code and never the
prompt; ``--log-format json`` as one JSON object per line; the id kept in the engine's
``/stats`` (recent requests, OOM faults)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from inferctl.contract.logs import formatter_for
from inferctl.engine.entrypoints.request_log import REQUEST_LOGGER
from tests.server_helpers import (  # noqa: F401 - stories_*_fixture are the engine and app fixtures
    ADMIN_TOKEN,
    auth,
    http_get,
    http_post,
    sse_events,
    stories_app_fixture,
    stories_engine_fixture,
)

PROMPT = "Once upon a time"


def _lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == REQUEST_LOGGER]


def test_completion_line_carries_the_request_id_and_the_usage(app, caplog):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    r = http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 7, "temperature": 0},
                  headers={"x-request-id": "trace-abc-1"})
    assert r.status_code == 200
    doc = r.json()
    [line] = _lines(caplog)
    assert line.levelno == logging.INFO
    assert line.request_id == "trace-abc-1" == r.headers["x-request-id"]
    assert line.id == doc["id"] and line.id.startswith("cmpl-")
    assert line.model == doc["model"] and line.endpoint == "/v1/completions"
    assert line.status == 200 and line.stream is False and line.client_disconnect is False
    assert line.prompt_tokens == doc["usage"]["prompt_tokens"] == 5
    assert line.completion_tokens == doc["usage"]["completion_tokens"]
    assert line.finish_reasons == [doc["choices"][0]["finish_reason"]]
    assert 0 < line.ttft_seconds <= line.e2e_seconds


def test_streamed_chat_with_n_choices_counts_every_choice(app, caplog):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    r = http_post(app, "/v1/chat/completions",
                  {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 6, "n": 2, "seed": 3,
                   "stream": True, "stream_options": {"include_usage": True}},
                  headers={"x-request-id": "chat-trace-2"})
    assert r.status_code == 200
    events = sse_events(r.text)
    usage = events[-2]["usage"]
    finishes = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in events[:-1]
                if c["choices"] and c["choices"][0]["finish_reason"]}
    [line] = _lines(caplog)
    assert line.request_id == "chat-trace-2" and line.id.startswith("chatcmpl-") and line.id == events[0]["id"]
    assert line.stream is True and line.status == 200 and line.client_disconnect is False
    assert line.prompt_tokens == usage["prompt_tokens"]
    assert line.completion_tokens == usage["completion_tokens"]
    assert line.finish_reasons == [finishes[0], finishes[1]]


def test_a_generated_request_id_is_the_one_answered_and_logged(app, caplog):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    r = http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}, headers={"x-request-id": "bad id"})
    [line] = _lines(caplog)
    assert line.request_id == r.headers["x-request-id"] != "bad id"


def test_an_error_is_logged_with_its_code_and_never_the_prompt(app, caplog):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    secret = "zebra-violet-secret prompt"
    r = http_post(app, "/v1/completions", {"prompt": secret, "max_tokens": 100000},
                  headers={"x-request-id": "err-1"})
    assert r.status_code == 400
    [line] = _lines(caplog)
    assert line.status == 400 and line.request_id == "err-1"
    assert line.error_code == r.json()["error"]["code"] and line.error_code
    assert line.completion_tokens is None and line.client_disconnect is False
    text = logging.Formatter().format(line) + json.dumps({k: str(v) for k, v in vars(line).items()})
    assert "zebra" not in text


def test_unknown_model_is_a_404_line(app, caplog):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    r = http_post(app, "/v1/completions", {"model": "nope", "prompt": PROMPT}, headers={"x-request-id": "m-404"})
    assert r.status_code == 404
    [line] = _lines(caplog)
    assert (line.status, line.error_code, line.model) == (404, r.json()["error"]["code"], None)


def test_json_format_is_one_object_per_line_with_the_request_id(app):
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter_for("json"))
    logger = logging.getLogger(REQUEST_LOGGER)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for rid in ("json-1", "json-2"):
            assert http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "temperature": 0},
                             headers={"x-request-id": rid}).status_code == 200
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = out.getvalue().splitlines()
    docs = [json.loads(line) for line in lines]
    assert [d["request_id"] for d in docs] == ["json-1", "json-2"]
    for d in docs:
        assert d["logger"] == REQUEST_LOGGER and d["level"] == "info" and d["status"] == 200
        assert d["completion_tokens"] == 3 and d["prompt_tokens"] == 5 and d["id"].startswith("cmpl-")
        assert d["time"].endswith("Z")


def test_the_request_id_reaches_the_engines_stats_and_its_oom_faults(app):
    assert http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2},
                     headers={"x-request-id": "stats-trace"}).status_code == 200
    recent = http_get(app, "/stats").json()["requests"]["recent"]
    assert recent[-1]["x_request_id"] == "stats-trace" and recent[-1]["request_id"].startswith("cmpl-")
    # an injected OOM blamed on the only running request: the fault names it
    assert http_post(app, "/admin/fault", {"kind": "oom", "count": 1}, headers=auth(ADMIN_TOKEN)).status_code == 200
    r = http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "temperature": 0},
                  headers={"x-request-id": "oom-trace"})
    assert r.status_code == 200
    fault = http_get(app, "/stats").json()["faults"]["recent"][-1]
    assert fault["x_request_id"] == "oom-trace"
    assert fault["request_id"] == r.json()["id"]


@pytest.mark.parametrize("path", ["/health", "/stats"])
def test_paths_outside_v1_get_no_line(app, caplog, path):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    assert http_get(app, path).status_code == 200
    assert _lines(caplog) == []
