"""The shared log formats (contract/logs.py), the engine's request-log middleware against fake
ASGI apps (a client that leaves, a crash), the ``log_format`` launch key and the request ids
in the controller's fault inputs."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from inferctl.contract.logs import JsonFormatter, TextFormatter, check_log_format, configure_logging
from inferctl.controller.config import ConfigError, parse_config
from inferctl.controller.policies.precision_inputs import fault_inputs, fault_numbers
from inferctl.engine.entrypoints.request_log import REQUEST_LOGGER, RequestLogMiddleware, current, error_code


def _record(**extra) -> logging.LogRecord:
    rec = logging.LogRecord("inferctl.x", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_json_formatter_writes_one_object_with_the_extra_fields():
    line = JsonFormatter().format(_record(request_id="r-1", status=200, odd=object()))
    assert "\n" not in line
    doc = json.loads(line)
    assert (doc["message"], doc["level"], doc["logger"], doc["request_id"], doc["status"]) == \
        ("hello world", "info", "inferctl.x", "r-1", 200)
    assert doc["odd"].startswith("<object")


def test_text_formatter_appends_key_values():
    assert TextFormatter().format(_record(request_id="r-2")).endswith("inferctl.x hello world request_id=r-2")


def test_other_formats_are_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--log-format"):
        check_log_format("xml")
    with pytest.raises(ValueError, match="--log-format"):
        configure_logging("yaml")


def test_error_code_reads_the_openai_object_else_the_status():
    assert error_code(b'{"error": {"code": "invalid_max_tokens"}}', 400) == "invalid_max_tokens"
    assert error_code(b"not json", 502) == "http_502"
    assert error_code(b'{"error": {"code": null}}', 401) == "http_401"


def _serve(app, path: str = "/v1/completions", headers: list | None = None) -> tuple[list, dict]:
    sent: list = []
    seen: dict = {}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    async def inner(scope, receive, send):
        seen["headers"] = dict(scope["headers"])
        seen["record"] = current()
        await app(scope, receive, send)

    scope = {"type": "http", "path": path, "method": "POST", "headers": headers or []}
    try:
        asyncio.run(RequestLogMiddleware(inner)(scope, receive, send))
    except RuntimeError:
        pass
    return sent, seen


def _lines(caplog):
    return [r for r in caplog.records if r.name == REQUEST_LOGGER]


def test_a_stream_the_client_left_is_a_disconnect(caplog):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)

    async def app(scope, receive, send):    # starts a stream, never sends its last body message
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})

    _, seen = _serve(app, headers=[(b"x-request-id", b"left-1")])
    [line] = _lines(caplog)
    assert (line.request_id, line.stream, line.status, line.client_disconnect) == ("left-1", True, 200, True)
    assert seen["record"].request_id == "left-1"


def test_a_missing_id_is_generated_into_the_request_headers(caplog):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    _, seen = _serve(app)
    [line] = _lines(caplog)
    assert seen["headers"][b"x-request-id"].decode() == line.request_id and len(line.request_id) == 32
    assert line.client_disconnect is False


def test_a_crash_is_a_500_line_at_warning(caplog):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)

    async def app(scope, receive, send):
        raise RuntimeError("boom")

    _serve(app)
    [line] = _lines(caplog)
    assert (line.levelno, line.status, line.error_code, line.client_disconnect) == \
        (logging.WARNING, 500, "http_500", False)


def test_other_paths_pass_untouched(caplog):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    _, seen = _serve(app, path="/health")
    assert _lines(caplog) == [] and seen["record"] is None and b"x-request-id" not in seen["headers"]


def _launch(**keys):
    return parse_config({"engines": [{"name": "main", "launch": {"port": 8123, **keys}}]}).engines[0].launch


def test_log_format_launch_key_becomes_the_engine_flag():
    assert "--log-format" not in _launch().engine_args()
    assert _launch(log_format="json", args=["--max-num-seqs", "8"]).engine_args()[-4:] == \
        ["--log-format", "json", "--max-num-seqs", "8"]
    with pytest.raises(ConfigError, match=r"engines\[0\]\.launch\.log_format"):
        _launch(log_format="xml")


def test_the_fault_inputs_carry_the_blamed_requests_ids():
    fault = {"id": 3, "time": 1.0, "kind": "exhaustion", "requested_bytes": 1024, "message": "oom",
             "request_id": "cmpl-1", "x_request_id": "trace-9"}
    nums, _ = fault_numbers(fault)
    inputs = fault_inputs(fault, nums, "exhaustion")
    assert (inputs["request_id"], inputs["x_request_id"]) == ("cmpl-1", "trace-9")


def test_the_degrade_decision_on_an_oom_names_the_blamed_request():
    from inferctl.controller.policies import PrecisionConfig, PrecisionPolicy
    from tests.policy_helpers import actions, engine, oom

    p = PrecisionPolicy(PrecisionConfig(hold_seconds=10.0, confirm_timeout_seconds=5.0))
    ds = p.observe(1.0, engine(1.0, faults=[oom(1, 1.0, request_id="cmpl-9", x_request_id="trace-oom")]))
    assert actions(ds) == ["degrade"]
    assert (ds[0].inputs["request_id"], ds[0].inputs["x_request_id"]) == ("cmpl-9", "trace-oom")


def test_a_model_list_poll_is_a_debug_line(caplog):
    caplog.set_level(logging.DEBUG, logger=REQUEST_LOGGER)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    sent: list = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    asyncio.run(RequestLogMiddleware(app)({"type": "http", "path": "/v1/models", "method": "GET", "headers": []},
                                          receive, send))
    [line] = _lines(caplog)
    assert line.levelno == logging.DEBUG and line.endpoint == "/v1/models"


def test_uvicorns_color_message_never_reaches_a_log_line():
    """uvicorn passes ``extra={"color_message": ...}`` (ANSI escapes for its own terminal
    formatter); ours must not print it into text or JSON lines."""
    from inferctl.contract.logs import extra_fields
    record = logging.LogRecord("uvicorn.error", logging.INFO, "x", 1, "Started server process [%d]", (7,), None)
    record.color_message = "Started server process [\x1b[36m%d\x1b[0m]"
    record.request_id = "abc"
    assert extra_fields(record) == {"request_id": "abc"}


def test_the_configured_handler_follows_sys_stderr(monkeypatch):
    """Regression: configure_logging bound the root handler to the stderr of the moment; a CLI
    run in-process (CliRunner swaps sys.stderr, then closes it) left every later log record
    printing "--- Logging error --- I/O operation on closed file" into other commands' output."""
    import io

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        first = io.StringIO()
        monkeypatch.setattr("sys.stderr", first)
        configure_logging("text", "info")
        first.close()                                     # the stream it was configured with is gone
        second = io.StringIO()
        monkeypatch.setattr("sys.stderr", second)
        logging.getLogger("inferctl.test").info("still logging")
        assert "still logging" in second.getvalue()
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
