"""Breaking the controller API with bad input: every malformed request is a 4xx naming the
field and the limit, never a 500, and a request never chooses who the audit log says acted."""

from __future__ import annotations

import pytest

from inferctl.controller.api import MAX_BODY_BYTES
from tests.controller_helpers import api_setup, strict_json

TOKEN = "t0ken-for-breaker-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def setup(tmp_path):
    return api_setup(tmp_path, TOKEN, raise_server_exceptions=False)


def error(resp) -> dict:
    return strict_json(resp.text)["error"]


@pytest.mark.parametrize("since_id", ["99999999999999999999999", str(2 ** 63)])
def test_since_id_beyond_sqlite_integer_is_400_naming_the_limit(setup, since_id):
    http, *_ = setup
    r = http.get("/events", params={"since_id": since_id})
    assert r.status_code == 400, r.text
    err = error(r)
    assert err["field"] == "since_id" and str(2 ** 63 - 1) in err["message"]
    # the largest id SQLite stores is still a valid cursor: no events after it
    r = http.get("/events", params={"since_id": str(2 ** 63 - 1)})
    assert r.status_code == 200 and r.json()["events"] == []


@pytest.mark.parametrize("name", ["limit", "since_id"])
@pytest.mark.parametrize("text", ["\uff11\uff10", "1_0", " 10", "\u0661"], ids=["full-width", "underscore", "space",
                                                                               "arabic-indic"])
def test_integer_parameters_take_ascii_digits_only(setup, name, text):
    """``int()`` reads "１０", "1_0" and " 10" as 10; a query parameter with them is a typo or a
    probe, answered 400 naming the parameter, not silently read as another number."""
    http, *_ = setup
    r = http.get("/events", params={name: text})
    assert r.status_code == 400, r.text
    assert error(r)["field"] == name and "not an integer" in error(r)["message"]
    assert http.get("/events", params={name: "+10"}).status_code == 200


@pytest.mark.parametrize("target", ["t" * 257, "main\x00", "a\nb"], ids=["too-long", "nul", "newline"])
def test_events_target_filter_is_checked(setup, target):
    http, *_ = setup
    r = http.get("/events", params={"target": target})
    assert r.status_code == 400, r.text
    assert error(r)["field"] == "target" and "256 printable" in error(r)["message"]
    assert http.get("/events", params={"target": "t" * 256}).status_code == 200


@pytest.mark.parametrize("content", [b"[" * 50_000, b'{"engine": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"],
                         ids=["array", "object"])
def test_deeply_nested_json_is_400_not_500(setup, content):
    http, _, client, _ = setup
    r = http.post("/actions/drain", content=content, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400, r.text[:200]
    err = error(r)
    assert err["field"] == "body" and "nested" in err["message"]
    assert client.calls == []


def test_oversized_body_is_413_naming_the_limit(setup):
    http, _, client, _ = setup
    big = b'{"engine": "' + b"a" * (4 * MAX_BODY_BYTES) + b'"}'
    r = http.post("/actions/drain", content=big, headers=AUTH)
    assert r.status_code == 413
    err = error(r)
    assert err["field"] == "body" and str(MAX_BODY_BYTES) in err["message"]
    assert str(len(big)) in err["message"]
    assert client.calls == []


def test_huge_query_value_is_not_echoed_back_whole(setup):
    http, *_ = setup
    r = http.get("/events", params={"kind": "k" * 60_000})
    assert r.status_code == 400
    err = error(r)
    assert err["field"] == "kind" and len(err["message"]) < 400
    assert "60000 characters" in err["message"]


@pytest.mark.parametrize("actor", ["hardware", "precision", "gpu_reset", "supervisor"])
def test_actor_header_cannot_impersonate_a_policy_in_the_audit_log(setup, actor):
    http, _, client, log = setup
    r = http.post("/actions/drain", json={"engine": "main"}, headers={**AUTH, "X-Inferctl-Actor": actor})
    assert r.status_code == 200, r.text
    ev = [e for e in log.query(kind="action") if e["id"] == r.json()["event_id"]][0]
    assert ev["source"] == f"operator:{actor}"


@pytest.mark.parametrize("actor", ["a" * 65, "bob smith", "x\ty", "bob;rm"], ids=["long", "space", "tab", "semicolon"])
def test_bad_actor_header_is_400_naming_it(setup, actor):
    http, _, client, _ = setup
    r = http.post("/actions/drain", json={"engine": "main"}, headers={**AUTH, "X-Inferctl-Actor": actor})
    assert r.status_code == 400
    err = error(r)
    assert err["field"] == "x-inferctl-actor" and "64" in err["message"]
    assert client.calls == []


def test_plain_operator_is_still_operator(setup):
    http, _, _, log = setup
    r = http.post("/actions/drain", json={"engine": "main"}, headers=AUTH)
    ev = [e for e in log.query(kind="action") if e["id"] == r.json()["event_id"]][0]
    assert ev["source"] == "operator"


def test_reset_of_a_gpu_the_source_does_not_know_adds_no_metric_series(setup):
    """A label value never comes from a request: an unknown GPU index is a 404 naming ``gpu``
    (docs/api.md; tests/unit/test_breaker_controller_cli.py) without a new
    ``inferctl_gpu_resets_total{gpu=...}`` series."""
    http, ctl, _, log = setup
    r = http.post("/actions/reset-gpu", json={"gpu": 999}, headers=AUTH)     # in range (0..999), not known
    assert r.status_code == 404 and r.json()["error"]["field"] == "gpu" and "999" in r.json()["error"]["message"]
    text = http.get("/metrics").text
    assert 'gpu="999"' not in text
    r = http.post("/actions/reset-gpu", json={"gpu": 1_000_000_000}, headers=AUTH)   # past the bound: 400
    assert r.status_code == 400 and r.json()["error"]["field"] == "gpu"
    assert 'gpu="1000000000"' not in http.get("/metrics").text
