"""The controller's engine ``launch:`` keys for the engine flags of issue 11 (prefix caching,
the repetition-stop default): validated at load, turned into ``engine serve`` flags."""

from __future__ import annotations

import pytest

from inferctl.controller.config import ConfigError, parse_config
from inferctl.controller.supervisor import engine_serve_argv


def launch(**keys):
    return parse_config({"engines": [{"name": "main", "launch": {"port": 8123, **keys}}]}).engines[0].launch


def test_defaults_add_no_flag():
    assert launch().engine_args() == []


def test_keys_become_engine_flags_before_the_extra_args():
    lc = launch(enable_prefix_caching=False, repetition_stop=True, args=["--max-num-seqs", "8"])
    assert lc.engine_args() == ["--no-enable-prefix-caching", "--repetition-stop", "--max-num-seqs", "8"]
    argv = engine_serve_argv(lc.port, lc.host, lc.model, lc.memory_budget, lc.engine_args())
    assert argv[-4:] == ["--no-enable-prefix-caching", "--repetition-stop", "--max-num-seqs", "8"]


@pytest.mark.parametrize("key", ["enable_prefix_caching", "repetition_stop"])
def test_non_booleans_are_refused_naming_the_key(key):
    with pytest.raises(ConfigError, match=rf"engines\[0\]\.launch\.{key}"):
        launch(**{key: "no"})
