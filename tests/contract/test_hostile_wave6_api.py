"""Wave-6 hostile input against the real engine API in process (stories260K, ASGI, no ports):
an unknown model name is echoed cut, not whole (a 100 kB name made a 100 kB error body), and
the admin routes refuse a key given twice instead of acting on the last value."""

from __future__ import annotations

from tests.server_helpers import auth, client, http_post, run, stories_app_fixture, stories_engine_fixture

app = stories_app_fixture
engine = stories_engine_fixture


def post_raw(app_, path: str, content: bytes, headers: dict):
    async def go():
        async with client(app_) as c:
            return await c.post(path, content=content, headers=headers)
    return run(go())


def test_an_unknown_huge_model_name_is_echoed_cut(app):
    name = "m" * 100_000
    r = http_post(app, "/v1/completions", {"model": name, "prompt": "Once", "max_tokens": 2})
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["param"] == "model" and err["code"] == "model_not_found"
    assert len(err["message"]) < 300 and "(100000 characters)" in err["message"]
    assert "served models: " in err["message"]
    short = http_post(app, "/v1/completions", {"model": "nope", "prompt": "Once", "max_tokens": 2})
    assert short.json()["error"]["message"].startswith("model: model 'nope' does not exist; served models: ")


def test_admin_bodies_refuse_a_key_given_twice(app):
    headers = {"content-type": "application/json", **auth()}
    r = post_raw(app, "/admin/precision", b'{"mode": "int8", "mode": "full"}', headers)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "mode" and "twice" in err["message"]
    r = post_raw(app, "/admin/drain", b'{"draining": false, "draining": true}', headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "draining"
    r = http_post(app, "/v1/completions", {"prompt": "Once", "max_tokens": 2})
    assert r.status_code == 200      # nothing was drained


def test_int4_is_start_only_so_the_admin_route_refuses_it_at_run_time(app):
    """contract/precision.py: int4 is chosen at start, never switched to or from at run time.
    Before: {"mode": "int4"} answered 200, the engine dropped its full weights, and every later
    switch answered 200 "requested" while the engine refused it in the background, for good."""
    headers = auth()
    r = http_post(app, "/admin/precision", {"mode": "int4"}, headers=headers)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "mode" and err["code"] == "start_only_mode" and "--precision int4" in err["message"]
    r = http_post(app, "/admin/precision", {"mode": "int8"}, headers=headers)
    assert r.status_code == 200 and r.json()["requested"] == "int8"
    r = http_post(app, "/admin/precision", {"mode": "full"}, headers=headers)
    assert r.status_code == 200


def test_a_huge_fault_kind_is_refused_without_echoing_it_whole(app):
    r = http_post(app, "/admin/fault", {"kind": "x" * 100_000, "count": 1}, headers=auth())
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "kind" and "32" in err["message"] and len(r.content) < 400
    r = http_post(app, "/admin/fault", {"kind": "nope", "count": 1}, headers=auth())
    assert r.status_code == 400 and "oom" in r.json()["error"]["message"]
