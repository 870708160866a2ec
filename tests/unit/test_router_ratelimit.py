"""Per-key rate limits of the router (router/ratelimit.py) and its ``--config`` file (router/config.py)."""

from __future__ import annotations

import json

import pytest

from inferctl.router.config import ConfigError, load_config_file
from inferctl.router.ratelimit import KeyLimit, RateLimiter, UsageMeter, bearer_key


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_requests_per_minute_refuses_with_the_seconds_until_a_request_token():
    clock = Clock()
    lim = RateLimiter({"sk-a": KeyLimit("team-a", requests_per_minute=2)}, clock=clock)
    assert lim.admit("sk-a").ok and lim.admit("sk-a").ok
    refused = lim.admit("sk-a")
    assert not refused.ok and refused.name == "team-a" and refused.limit == "requests"
    assert refused.retry_after == 30                 # 1 token at 2/min = 30 s
    clock.t = 29.0
    assert not lim.admit("sk-a").ok and lim.admit("sk-a").retry_after == 1
    clock.t = 30.0
    assert lim.admit("sk-a").ok


def test_tokens_are_debited_from_usage_and_an_overdraft_waits_for_the_refill():
    clock = Clock()
    lim = RateLimiter({"sk-a": KeyLimit("team-a", tokens_per_minute=600)}, clock=clock)   # 10 tokens/s
    assert lim.admit("sk-a").ok
    lim.charge("team-a", 900)                        # one long answer: 300 tokens of debt
    refused = lim.admit("sk-a")
    assert not refused.ok and refused.limit == "tokens" and refused.retry_after == 30
    clock.t = 30.5
    assert lim.admit("sk-a").ok


def test_keys_not_listed_share_the_default_and_without_one_are_not_limited():
    clock = Clock()
    lim = RateLimiter({"sk-a": KeyLimit("team-a", requests_per_minute=100)},
                      default=KeyLimit("default", requests_per_minute=1), clock=clock)
    assert lim.admit("sk-other").ok
    r = lim.admit(None)
    assert not r.ok and r.name == "default"          # no key and an unknown key share one bucket
    assert lim.admit("sk-a").ok
    free = RateLimiter({"sk-a": KeyLimit("team-a", requests_per_minute=1)}, clock=clock)
    assert all(free.admit("sk-b").ok for _ in range(10))


def test_bearer_key():
    assert bearer_key("Bearer sk-1") == "sk-1" and bearer_key("bearer  sk-1 ") == "sk-1"
    assert bearer_key(None) is None and bearer_key("Basic abc") is None and bearer_key("Bearer ") is None


def test_usage_meter_reads_usage_or_counts_stream_chunks():
    m = UsageMeter(stream=False)
    m.feed(json.dumps({"choices": [], "usage": {"total_tokens": 42}}).encode())
    assert m.tokens == 42
    s = UsageMeter(stream=True)
    for i in range(3):
        s.feed(b'data: {"choices": [{"text": "x"}]}\n\n')
    s.feed(b"data: [DONE]\n\n")
    assert s.tokens == 3
    u = UsageMeter(stream=True)
    u.feed(b'data: {"choices": [{"text": "x"}]}\n\ndata: {"choices": [], "usage": {"total_to')
    u.feed(b'kens": 17}}\n\ndata: [DONE]\n\n')          # split across chunks
    assert u.tokens == 17


def write(tmp_path, text):
    p = tmp_path / "router.yaml"
    p.write_text(text)
    return str(p)


def test_config_file_engines_controller_and_limits(tmp_path):
    path = write(tmp_path, """
engines:
  - {name: a, url: "http://127.0.0.1:8000/"}
controller: http://127.0.0.1:8900
rate_limits:
  default: {requests_per_minute: 600}
  keys:
    - {name: team-a, key: sk-aaa, requests_per_minute: 60, tokens_per_minute: 20000}
    - {name: team-b, key_env: TEAM_B_KEY, tokens_per_minute: 1000}
""")
    doc = load_config_file(path, env={"TEAM_B_KEY": "sk-bbb"})
    assert [(e.name, e.url) for e in doc["engines"]] == [("a", "http://127.0.0.1:8000")]
    assert doc["controller"] == "http://127.0.0.1:8900"
    assert doc["rate_keys"]["sk-aaa"] == KeyLimit("team-a", 60.0, 20000.0)
    assert doc["rate_keys"]["sk-bbb"] == KeyLimit("team-b", None, 1000.0)
    assert doc["rate_default"] == KeyLimit("default", 600.0, None)


@pytest.mark.parametrize("text, where", [
    ("rate_limits: {keys: [{name: t, key: k, requests_per_minute: -1}]}", "rate_limits.keys[0].requests_per_minute"),
    ("rate_limits: {keys: [{name: t, key: k, tokens_per_minute: yes}]}", "rate_limits.keys[0].tokens_per_minute"),
    ("rate_limits: {keys: [{name: t, key: k}]}", "rate_limits.keys[0]: give requests_per_minute"),
    ("rate_limits: {keys: [{key: k, requests_per_minute: 1}]}", "rate_limits.keys[0].name"),
    ("rate_limits: {keys: [{name: t, key_env: NOPE, requests_per_minute: 1}]}", "rate_limits.keys[0].key_env"),
    ("rate_limits: {keys: [{name: t, requests_per_minute: 1}]}", "exactly one of key and key_env"),
    ("rate_limits: {keys: [{name: t, key: k, requests_per_minute: 1}, {name: t, key: j, requests_per_minute: 1}]}",
     "rate_limits.keys[1].name: duplicate"),
    ("rate_limits: {keys: [{name: t, key: k, rpm: 1}]}", "rate_limits.keys[0].rpm: unknown key"),
    ("engines: [{name: a, url: ftp://x}]", "engines[0]"),
    ("engine: []", "engine: unknown key"),
])
def test_config_errors_name_the_field(tmp_path, text, where):
    with pytest.raises(ConfigError, match=r"--config .*: ") as exc:
        load_config_file(write(tmp_path, text), env={})
    assert where in str(exc.value)
    assert "sk-" not in str(exc.value)
