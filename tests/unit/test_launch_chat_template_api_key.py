"""The controller's engine ``launch:`` keys for the engine's ``--chat-template`` and ``--api-key``:
checked at load (naming the key), the template passed as a flag, the key only in the engine's
environment ($INFERCTL_API_KEY), never on its command line."""

from __future__ import annotations

import pytest

from inferctl.controller.config import ConfigError, check_files, parse_config
from inferctl.controller.config_launch import API_KEY_ENV, launch_env
from inferctl.controller.supervisor import engine_serve_argv


def config(**keys):
    return parse_config({"engines": [{"name": "main", "launch": {"port": 8123, **keys}}]})


def launch(**keys):
    return config(**keys).engines[0].launch


@pytest.mark.parametrize("value", ["roles", "{% for m in messages %}{{ m.content }}{% endfor %}"])
def test_chat_template_becomes_the_engine_flag(value):
    lc = launch(chat_template=value, args=["--max-num-seqs", "8"])
    assert lc.engine_args() == ["--chat-template", value, "--max-num-seqs", "8"]
    argv = engine_serve_argv(lc.port, lc.host, lc.model, lc.memory_budget, lc.engine_args())
    assert argv[argv.index("--chat-template") + 1] == value


def test_a_template_that_does_not_compile_is_refused_at_load_naming_the_key():
    with pytest.raises(ConfigError, match=r"engines\[0\]\.launch\.chat_template: the Jinja template does not "
                                          r"compile: line 1: .*endfor"):
        launch(chat_template="{% for m in messages %}{{ m.content }}")


def test_a_template_file_is_checked_with_the_other_files(tmp_path):
    good = tmp_path / "t.jinja"
    good.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", encoding="utf-8")
    check_files(config(chat_template=str(good)))                      # fine
    assert launch(chat_template=str(good)).engine_args() == ["--chat-template", str(good)]
    with pytest.raises(ConfigError, match=r"engines\[0\]\.launch\.chat_template: '/nope/t.jinja' is neither"):
        check_files(config(chat_template="/nope/t.jinja"))
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ messages[0].content ", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"launch\.chat_template: .*bad\.jinja: the Jinja template does not compile"):
        check_files(config(chat_template=str(bad)))


def test_api_key_goes_to_the_engine_environment_not_its_argv():
    lc = launch(api_key="sk-test-0123")
    assert "sk-test-0123" not in " ".join(engine_serve_argv(lc.port, lc.host, lc.model, lc.memory_budget,
                                                            lc.engine_args()))
    assert launch_env(lc) == {API_KEY_ENV: "sk-test-0123"}
    assert launch_env(launch()) == {}                                 # no key: /v1 open, nothing set


@pytest.mark.parametrize("value, words", [("", "empty"), ("two words", "visible ASCII"), ("k" * 5000, "characters")])
def test_unusable_api_keys_are_refused_at_load_naming_the_key(value, words):
    with pytest.raises(ConfigError, match=rf"engines\[0\]\.launch\.api_key: .*{words}"):
        launch(api_key=value)


def test_api_key_env_is_read_at_start_and_checked_at_load(monkeypatch):
    monkeypatch.setenv("MY_ENGINE_KEY", "from-env-key")
    cfg = config(api_key_env="MY_ENGINE_KEY")
    check_files(cfg)
    assert launch_env(cfg.engines[0].launch) == {API_KEY_ENV: "from-env-key"}
    assert launch_env(launch(api_key="given", api_key_env="MY_ENGINE_KEY")) == {API_KEY_ENV: "given"}
    monkeypatch.setenv("MY_ENGINE_KEY", "has space")
    with pytest.raises(ConfigError, match=r"engines\[0\]\.launch\.api_key_env: \$MY_ENGINE_KEY"):
        check_files(config(api_key_env="MY_ENGINE_KEY"))
    monkeypatch.delenv("MY_ENGINE_KEY")
    assert launch_env(config(api_key_env="MY_ENGINE_KEY").engines[0].launch) == {}
