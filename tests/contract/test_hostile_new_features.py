"""Hostile input against the wave-3 features in-process: ``engine serve`` flags refused with one
line and exit 2 before any model loads (CliRunner), the ``/v1`` API key middleware."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tests.server_helpers import STORIES, http_post, make_app, stories_engine_fixture

engine = stories_engine_fixture


def serve_cli(args: list[str], env: dict | None = None):
    from inferctl.cli import app
    return CliRunner().invoke(app, ["engine", "serve", "--port", "0", "--device", "cpu", *args], env=env)


# ------------------------------------------------------------------ --speculative-config
def test_speculative_config_nested_too_deeply_exits_2_in_one_line(stories_dir):
    res = serve_cli(["--model", str(stories_dir / "stories260K.bin"), "--speculative-config", "[" * 100_000])
    assert res.exit_code == 2, res.output
    assert "speculative_config: must be a flat JSON object: nested too deeply" in res.output
    assert "Traceback" not in res.output and "RecursionError" not in res.output


# ------------------------------------------------------------------ --api-key
@pytest.mark.parametrize("key, says", [("", "the API key is empty"), ("   ", "the API key is empty"),
                                       (" padded ", "visible ASCII only"), ("ключ-secret", "visible ASCII only")])
def test_engine_serve_refuses_an_api_key_no_client_could_send(stories_dir, key, says):
    res = serve_cli(["--model", str(stories_dir / "stories260K.bin"), "--api-key", key])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: --api-key (or $INFERCTL_API_KEY)") and says in res.output


def test_api_key_middleware_refuses_an_unsendable_key_and_guards_with_a_good_one(engine):
    with pytest.raises(ValueError, match="api_key: the API key is empty"):
        make_app({STORIES: engine}, api_key=" ")
    app = make_app({STORIES: engine}, api_key="sk-good")
    body = {"prompt": "Once", "max_tokens": 1}
    assert http_post(app, "/v1/completions", body).status_code == 401
    assert http_post(app, "/v1/completions", body, headers={"authorization": "Bearer sk-goo"}).status_code == 401
    assert http_post(app, "/v1/completions", body, headers={"authorization": "bearer sk-good"}).status_code == 200


# ------------------------------------------------------------------ --chat-template
def test_chat_template_failing_on_a_request_is_a_400_and_the_engine_keeps_serving(engine):
    from inferctl.engine.chat_template import resolve_chat_template
    tpl = resolve_chat_template("{% for m in messages %}{{ m.content }}{% if m.content == 'zero' %}{{ 1 // 0 }}"
                                "{% endif %}{% endfor %}")
    app = make_app({STORIES: engine}, chat_template=tpl)
    r = http_post(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": "zero"}], "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and err["code"] == "chat_template" and "ZeroDivisionError" in err["message"]
    r = http_post(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Once"}], "max_tokens": 2,
                                                     "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
