"""Router flags that were accepted and then broke the router quietly.

``--epsilon nan`` (no replica is ever within a NaN bound), ``--probe-interval inf`` (never
probed again after the first round), ``--upstream-timeout inf`` and ``--controller
http://x:99999`` (a port no socket has: every poll failed) all started a router. Each is now
a ConfigError naming the flag and the limit (exit 2 from ``inferctl router``).
"""

from __future__ import annotations

import math

import pytest

from inferctl.router.config import ConfigError, EngineSpec, RouterConfig

BASE = {"engines": (EngineSpec("a", "http://127.0.0.1:8000"),)}


@pytest.mark.parametrize("kwargs, words", [
    ({"epsilon": math.nan}, "--epsilon: must be a finite number >= 0"),
    ({"epsilon": math.inf}, "--epsilon: must be a finite number >= 0"),
    ({"probe_interval_seconds": math.inf}, "--probe-interval: must be > 0 and <= 86400 seconds"),
    ({"probe_interval_seconds": math.nan}, "--probe-interval: must be > 0 and <= 86400 seconds"),
    ({"probe_timeout_seconds": 1e300}, "--probe-timeout: must be > 0 and <= 86400 seconds"),
    ({"upstream_timeout_seconds": math.inf}, "--upstream-timeout: must be > 0 and <= 86400 seconds"),
    ({"controller": "http://127.0.0.1:99999"}, "--controller: URL 'http://127.0.0.1:99999' has port 99999, outside"),
    ({"controller": "http://127.0.0.1:port"}, "--controller: URL 'http://127.0.0.1:port' has port 'port', not a"),
    ({"controller": "http://u:secret@127.0.0.1:8900"}, "--controller: URL '<URL with credentials>' carries"),
])
def test_bad_router_settings_are_refused_naming_the_flag(kwargs, words):
    with pytest.raises(ConfigError) as err:
        RouterConfig(**BASE, **kwargs).validate()
    assert str(err.value).startswith(words), str(err.value)
    assert "secret" not in str(err.value)


@pytest.mark.parametrize("kwargs", [{"epsilon": 0.0}, {"epsilon": 3.5}, {"probe_interval_seconds": 86400.0},
                                    {"upstream_timeout_seconds": 3600.0},
                                    {"controller": "http://127.0.0.1:8900"}, {"controller": "https://ctl.test/"}])
def test_good_router_settings_still_pass(kwargs):
    assert RouterConfig(**BASE, **kwargs).validate() is not None
