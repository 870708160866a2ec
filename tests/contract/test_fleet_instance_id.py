"""The engine's process identity (issue 9, hole 1): ``instance_id`` in ``/health`` and in
``/stats`` ``engine.instance_id``, one per server, the same on every call; a new server (a
restarted process) has another. The controller proves a restart by it (controller/restart_proof.py)."""

from __future__ import annotations

import re

from tests.server_helpers import STORIES, demo_engine, engines_running, http_get, make_app


def test_instance_id_is_stable_per_server_and_new_per_server():
    eng = demo_engine(STORIES)
    with engines_running(eng):
        first, second = make_app({STORIES: eng}), make_app({STORIES: eng})
        h1, h1_again = http_get(first, "/health").json(), http_get(first, "/health").json()
        stats = http_get(first, "/stats").json()
        h2 = http_get(second, "/health").json()
    assert re.fullmatch(r"[0-9a-f]{32}", h1["instance_id"])
    assert h1["instance_id"] == h1_again["instance_id"] == stats["engine"]["instance_id"]
    assert h2["instance_id"] != h1["instance_id"]
