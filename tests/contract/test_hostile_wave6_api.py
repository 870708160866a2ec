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
