"""Hostile input, pure rules: the Host rule (DNS rebinding), the JSON Content-Type rule, the
prompt size bound, admin-token checks, and aborted requests kept out of the latency stats."""

from __future__ import annotations

import asyncio
import json

import pytest

from inferctl.contract.errors import APIError
from inferctl.contract.hosts import HostGuard, host_allowed, host_name
from inferctl.contract.http import (MIN_ADMIN_TOKEN_CHARS, BodyRejected, check_admin_token, check_json_content_type,
                                    read_json_body, read_token_file)
from inferctl.contract.openai import check_prompt_chars, max_prompt_chars


# ------------------------------------------------------------------ Host rule
@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "LOCALHOST.:9", "127.0.0.1", "127.0.0.1:8000",
                                  "127.9.8.7:1", "[::1]", "[::1]:8000", None, ""])
def test_loopback_bound_accepts_loopback_names(host):
    assert host_allowed(host, "127.0.0.1")
    assert host_allowed(host, "::1")
    assert host_allowed(host, "localhost")


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "localhost.evil.example",
                                  "127.0.0.1.evil.example:80", "10.0.0.5:8000", "[2001:db8::1]:80"])
def test_loopback_bound_refuses_other_names(host):
    assert not host_allowed(host, "127.0.0.1")
    assert not host_allowed(host, "localhost")


def test_allowed_hosts_extend_a_loopback_bind():
    assert host_allowed("gpu-box.lan:8000", "127.0.0.1", ("gpu-box.lan",))
    assert host_allowed("a.corp.example", "127.0.0.1", ("*.corp.example",))
    assert not host_allowed("corp.example", "127.0.0.1", ("*.corp.example",))
    assert not host_allowed("evilcorp.example", "127.0.0.1", ("*.corp.example",))


def test_non_loopback_bind_accepts_any_name_unless_some_are_listed():
    assert host_allowed("whatever.example:8000", "0.0.0.0")
    assert host_allowed("evil.example", "10.1.2.3")
    listed = ("api.example.com",)
    assert host_allowed("api.example.com:443", "0.0.0.0", listed)
    assert not host_allowed("evil.example", "0.0.0.0", listed)
    # an IP literal cannot come from a rebinding page: probes and scrapes by pod IP pass
    assert host_allowed("10.4.5.6:8000", "0.0.0.0", listed)
    assert host_allowed("127.0.0.1:8000", "0.0.0.0", listed)


def test_host_name_parsing():
    assert host_name("[::1]:8000") == "::1"
    assert host_name("Example.COM.:80") == "example.com"
    assert host_name("::1") == "::1"


def _call(app, host: bytes | None, scope_type: str = "http") -> tuple[list, list]:
    sent: list = []
    reached: list = []

    async def inner(scope, receive, send):
        reached.append(scope["type"])

    async def send(msg):
        sent.append(msg)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    headers = [] if host is None else [(b"host", host)]
    asyncio.run(HostGuard(inner, "127.0.0.1", render=app)(
        {"type": scope_type, "headers": headers, "path": "/"}, receive, send))
    return sent, reached


def test_host_guard_middleware_answers_421_in_the_api_envelope():
    sent, reached = _call(None, b"evil.example:8000")
    assert reached == []
    assert sent[0]["status"] == 421
    err = json.loads(sent[1]["body"])["error"]
    assert err["code"] == "host_not_allowed" and err["param"] == "Host"
    assert "evil.example" in err["message"] and "--allowed-host" in err["message"]
    # a custom renderer (the controller's envelope) is used as given
    sent, _ = _call(lambda exc: json.dumps({"error": {"code": exc.reason, "field": exc.param}}).encode(),
                    b"evil.example")
    assert json.loads(sent[1]["body"]) == {"error": {"code": "host_not_allowed", "field": "Host"}}


def test_host_guard_passes_allowed_hosts_and_lifespan():
    assert _call(None, b"127.0.0.1:8000") == ([], ["http"])
    assert _call(None, None, "lifespan") == ([], ["lifespan"])
    sent, reached = _call(None, b"evil.example", "websocket")
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]


# ------------------------------------------------------------------ Content-Type
@pytest.mark.parametrize("ct", ["application/json", "application/json; charset=utf-8", "Application/JSON",
                                "application/vnd.inferctl+json"])
def test_json_content_types_pass(ct):
    check_json_content_type(ct)


@pytest.mark.parametrize("ct", [None, "", "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                "multipart/form-data; boundary=x", "application/jsonp", "application/+json"])
def test_other_content_types_are_415_naming_the_header(ct):
    with pytest.raises(BodyRejected) as err:
        check_json_content_type(ct)
    assert err.value.status == 415 and err.value.param == "Content-Type"
    assert "Content-Type" in err.value.message and "application/json" in err.value.message


class _Req:
    def __init__(self, body: bytes, headers: dict):
        self.headers, self._body, self.read = headers, body, False

    async def stream(self):
        self.read = True
        yield self._body


def test_read_json_body_refuses_text_plain_before_reading():
    req = _Req(b'{"prompt": "x"}', {"content-type": "text/plain"})
    with pytest.raises(BodyRejected) as err:
        asyncio.run(read_json_body(req, 1000))
    assert err.value.status == 415 and req.read is False
    ok = _Req(b'{"a": 1}', {"content-type": "application/json"})
    assert asyncio.run(read_json_body(ok, 1000)) == {"a": 1}


# ------------------------------------------------------------------ prompt size bound
def test_max_prompt_chars_is_context_times_longest_token():
    assert max_prompt_chars(512, [0, 1, 7, 3]) == 512 * 7
    assert max_prompt_chars(100, []) == 100         # no tokens listed: one character per token
    assert max_prompt_chars(100, [0, 0]) == 100


def test_check_prompt_chars_names_the_field_and_the_limit():
    check_prompt_chars(3584, 3584, 512)
    check_prompt_chars(10**9, None, 512)
    with pytest.raises(APIError) as err:
        check_prompt_chars(3585, 3584, 512, param="messages")
    e = err.value
    assert e.status == 400 and e.param == "messages" and e.code == "context_length_exceeded"
    assert "3585 characters" in e.message and "3584" in e.message and "512" in e.message


def test_the_bound_never_refuses_a_prompt_that_fits(stories_dir):
    """Every text above the bound really tokenizes to more than max_model_len tokens
    (stories260K's real tokenizer: the longest token is packed end to end)."""
    from inferctl.engine.tokenizer import Llama2cTokenizer

    tok = Llama2cTokenizer(stories_dir / "tok512.bin")
    lengths = [len(tok.token_bytes(i)) for i in range(tok.vocab_size)]
    longest = max(range(tok.vocab_size), key=lambda i: lengths[i])
    piece = tok.token_bytes(longest).decode("utf-8")
    limit = max_prompt_chars(64, lengths)
    text = (piece * (limit // len(piece) + 2))[:limit + 1]
    assert len(text) == limit + 1
    assert len(tok.encode(text, bos=False)) > 64


# ------------------------------------------------------------------ admin tokens
def test_admin_token_rules():
    good = "x" * MIN_ADMIN_TOKEN_CHARS
    assert check_admin_token(good, "--admin-token") == good
    for bad, words in (("short-token", "at least 16"), ("-" + "x" * 20, "starts with '-'"),
                       ("x" * 10 + " " + "x" * 10, "whitespace")):
        with pytest.raises(ValueError) as err:
            check_admin_token(bad, "--admin-token")
        assert str(err.value).startswith("--admin-token:") and words in str(err.value)


def test_token_file_is_read_and_stripped(tmp_path):
    f = tmp_path / "token"
    f.write_text("abcdefghijklmnopqrstu\n")
    assert read_token_file(str(f), "--token-file") == "abcdefghijklmnopqrstu"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="--token-file: the token file .* is empty"):
        read_token_file(str(tmp_path / "empty"), "--token-file")
    with pytest.raises(ValueError, match="--token-file: cannot read"):
        read_token_file(str(tmp_path / "missing"), "--token-file")


def test_up_generates_a_token_that_passes_the_rules():
    from inferctl.controller.up import generate_token

    # 2,000 tokens: a URL-safe generator starts one in 64 with '-' (a CI run hit it), so the old
    # generator fails here with probability 1 - (63/64)**2000 (all but certain)
    tokens = {generate_token() for _ in range(2000)}
    assert len(tokens) == 2000
    for t in tokens:
        assert len(t) == 48 and check_admin_token(t, "generated") == t


# ------------------------------------------------------------------ aborts are not successes
def _finished(reason: str, e2e: float):
    from inferctl.engine.quality import score_output
    from inferctl.engine.stats import FinishedRequestStats

    return FinishedRequestStats("r-" + reason, reason, 4, 2, 0.5, e2e, score_output([5, 6], [-1.0, -1.0], 4, reason),
                                "full", 0, None)


def test_engine_stats_count_aborts_apart_from_latencies():
    from inferctl.engine.stats import EngineStats, IterationStats

    st = EngineStats()
    st.record(None, IterationStats(finished=[_finished("stop", 1.0), _finished("abort", 99.0),
                                             _finished("error", 50.0)]))
    assert st.aborted_total == 1 and st.errors_total == 1 and st.finished_total == 3
    assert list(st.e2e) == [1.0]


def test_prometheus_e2e_histogram_takes_successes_only():
    from inferctl.engine.stat_loggers import PrometheusStatLogger
    from inferctl.engine.stats import IterationStats

    log = PrometheusStatLogger("m", 1000)
    # the abort series exists at 0 from the start (a dashboard's rate() has data before the first abort)
    assert log.registry.get_sample_value("inferctl_engine_request_aborts_total",
                                         {"model": "m", "reason": "client_disconnect"}) == 0
    log.record(None, IterationStats(finished=[_finished("length", 2.0), _finished("abort", 99.0)]))
    reg = log.registry
    assert reg.get_sample_value("inferctl_engine_e2e_request_latency_seconds_count", {"model": "m"}) == 1
    assert reg.get_sample_value("inferctl_engine_e2e_request_latency_seconds_sum", {"model": "m"}) == 2.0
    assert reg.get_sample_value("inferctl_engine_requests_total", {"model": "m", "finish_reason": "abort"}) == 1
