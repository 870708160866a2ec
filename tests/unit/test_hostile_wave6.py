"""Wave-6 hostile input, pure parts: a JSON object naming one key twice (the strict admin
readers refuse it instead of acting on the last value) and the controller API's GPU index
bound on reset-gpu / release-gpu (0..999, as pause/resume); the router's ``--engine`` URLs
limited to ``http(s)://host[:port]`` (exit 2 naming the flag and the problem)."""

from __future__ import annotations

import pytest

from inferctl.contract.http import BodyRejected, parse_json
from tests.controller_helpers import api_setup

TOKEN = "t0ken-for-wave6"
AUTH = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}


def test_parse_json_keeps_the_last_duplicate_by_default_and_refuses_it_when_asked():
    assert parse_json(b'{"a": 1, "a": 2}') == {"a": 2}       # the OpenAI routes: json.loads semantics
    with pytest.raises(BodyRejected) as e:
        parse_json(b'{"engine": "other", "engine": "main"}', reject_duplicate_keys=True)
    assert e.value.status == 400 and e.value.reason == "duplicate_key" and e.value.param == "engine"
    assert "engine" in e.value.message and "twice" in e.value.message
    with pytest.raises(BodyRejected) as e:
        parse_json(b'{"x": {"k": 1, "k": 2}}', reject_duplicate_keys=True)
    assert e.value.param == "k"
    assert parse_json(b'{"a": {"b": 1}, "b": 2}', reject_duplicate_keys=True) == {"a": {"b": 1}, "b": 2}


@pytest.mark.parametrize("path, body", [
    ("/actions/degrade", b'{"engine": "decoy", "engine": "main"}'),
    ("/actions/restart", b'{"engine": "main", "force": false, "force": true}'),
    ("/actions/reset-gpu", b'{"gpu": 0, "dry_run": true, "dry_run": false}'),
])
def test_controller_actions_refuse_a_key_given_twice_and_do_nothing(tmp_path, path, body):
    http, _, client, _ = api_setup(tmp_path, TOKEN)
    r = http.post(path, content=body, headers=AUTH)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_field" and err["field"] in ("engine", "force", "dry_run")
    assert "twice" in err["message"]
    assert client.calls == []


@pytest.mark.parametrize("path", ["/actions/reset-gpu", "/actions/release-gpu"])
@pytest.mark.parametrize("gpu", [1000, 10 ** 23])
def test_gpu_index_above_the_limit_is_a_400_naming_it(tmp_path, path, gpu):
    http, _, client, _ = api_setup(tmp_path, TOKEN)
    body = {"gpu": gpu, "dry_run": True} if path.endswith("reset-gpu") else {"gpu": gpu}
    r = http.post(path, json=body, headers=AUTH)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["field"] == "gpu" and err["message"] == f"gpu: must be 0..999, got {gpu}"
    r = http.post(path, json={"gpu": -1}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["message"] == "gpu: must be 0..999, got -1"


@pytest.mark.parametrize("text, says", [
    ("e0=http://127.0.0.1:99999", "port 99999, outside 1-65535"), ("e0=http://127.0.0.1:0", "port 0, outside 1-65535"),
    ("e0=http://127.0.0.1:abc", "port 'abc', not a number"), ("e0=http://127.0.0.1:", "an empty port"),
    ("e0=http://user:s3cr3t@127.0.0.1:8000", "carries credentials"),
    ("e0=http://127.0.0.1:8000/v1?x=1#f", "has a path ('/v1')"), ("e0=http://127.0.0.1:8000?x=1", "has a query"),
    ("e0=http://127.0.0.1:8000#f", "has a fragment")])
def test_router_engine_urls_outside_host_and_port_are_refused(text, says):
    from inferctl.router.config import ConfigError, parse_engine

    with pytest.raises(ConfigError, match="--engine") as e:
        parse_engine(text)
    assert says in str(e.value) and str(e.value).startswith("--engine: e0: URL ")
    assert "s3cr3t" not in str(e.value)                     # credentials are never echoed


def test_router_engine_urls_of_host_and_port_still_load():
    from inferctl.router.config import parse_engine

    for text, url in [("a=http://127.0.0.1:8000/", "http://127.0.0.1:8000"), ("b=https://h", "https://h"),
                      ("c=http://[::1]:65535", "http://[::1]:65535"), ("d=http://h:1", "http://h:1")]:
        assert parse_engine(text).url == url


def test_router_cli_and_config_file_exit_2_naming_the_flag_and_the_problem(tmp_path):
    from typer.testing import CliRunner

    from inferctl.cli import app

    res = CliRunner().invoke(app, ["router", "--engine", "e0=http://127.0.0.1:99999"])
    assert res.exit_code == 2 and "--engine: e0: URL 'http://127.0.0.1:99999' has port 99999" in res.output
    f = tmp_path / "router.yaml"
    f.write_text("engines: [{name: a, url: 'http://u:secret@127.0.0.1:8000'}]\n")
    res = CliRunner().invoke(app, ["router", "--config", str(f)])
    assert res.exit_code == 2 and "engines[0]: a: URL" in res.output and "carries credentials" in res.output
    assert "secret" not in res.output


@pytest.mark.parametrize("query, field", [("kind=action&kind=step", "kind"), ("since_id=5&since_id=-1", "since_id"),
                                          ("limit=5&limit=6", "limit"), ("target=main&target=gpu:0", "target")])
def test_events_refuse_a_query_parameter_given_twice(tmp_path, query, field):
    http, _, _, _ = api_setup(tmp_path, TOKEN)
    r = http.get(f"/events?{query}")
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["field"] == field and "twice" in err["message"]
    assert http.get(f"/events?{query.split('&')[0]}").status_code == 200
