"""End to end: two real ``inferctl engine serve`` replicas, ``inferctl router`` in front of them
(subprocesses on loopback ports), the official ``openai`` client through the router
(completions, chat, streaming), JSON logs with the request id, a real-socket client
disconnect, and a killed replica routed around."""

from __future__ import annotations

import json
import os
import socket
import time

import httpx
import openai
import pytest

from tests.server_helpers import REFERENCE, STORIES, free_port, start_inferctl, stop_all, wait_ready

pytestmark = pytest.mark.e2e

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def fleet(stories_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("router")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs, engines = [], {}
    try:
        for name in ("r0", "r1"):
            port = free_port()
            log = tmp / f"{name}.log"
            cmd = ["engine", "serve", "--model", str(stories_dir / "stories260K.bin"),
                   "--port", str(port), "--max-model-len", "512", "--memory-budget", "512MiB",
                   "--log-format", "json"]
            proc = start_inferctl(cmd, log, env=env)
            procs.append(proc)
            engines[name] = {"url": f"http://127.0.0.1:{port}", "proc": proc, "log": log}
        for e in engines.values():
            wait_ready(e["url"] + "/health", e["proc"], e["log"], timeout=60)
        port = free_port()
        log = tmp / "router.log"
        cmd = ["router", "--port", str(port), "--probe-interval", "0.2",
               "--log-format", "json"] + [a for n, e in engines.items() for a in ("--engine", f"{n}={e['url']}")]
        router = start_inferctl(cmd, log, env=env)
        procs.append(router)
        base = f"http://127.0.0.1:{port}"
        wait_ready(base + "/ready", router, log, timeout=60)
        yield {"base": base, "engines": engines, "router": router, "log": log}
    finally:
        stop_all(procs, grace=15)


@pytest.fixture(scope="module")
def oai(fleet):
    return openai.OpenAI(base_url=fleet["base"] + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_openai_client_through_the_router(oai, fleet):
    models = oai.models.list()
    assert [m.id for m in models.data] == [STORIES]
    plain = oai.completions.create(model=STORIES, prompt=PROMPT, max_tokens=30, temperature=0)
    assert plain.choices[0].text[:60] == REFERENCE[:60]
    stream = oai.completions.create(model=STORIES, prompt=PROMPT, max_tokens=30, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == plain.choices[0].text
    chat = oai.chat.completions.create(model=STORIES, messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=30, temperature=0)
    chunks = list(oai.chat.completions.create(model=STORIES, messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=30, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    assert "".join((c.choices[0].delta.content or "") for c in chunks if c.choices) == chat.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 30
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=STORIES, prompt="", max_tokens=5)
    assert info.value.body["param"] == "prompt"


def test_json_logs_carry_the_request_id(fleet):
    r = httpx.post(fleet["base"] + "/v1/completions", headers={"X-Request-Id": "e2e-rid-1"},
                   json={"model": STORIES, "prompt": PROMPT, "max_tokens": 4}, timeout=30)
    assert r.status_code == 200 and r.headers["x-request-id"] == "e2e-rid-1"
    assert r.headers["x-inferctl-replica"] in ("r0", "r1")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lines = [json.loads(line) for line in fleet["log"].read_text().splitlines() if line.startswith("{")]
        mine = [d for d in lines if d.get("request_id") == "e2e-rid-1"]
        if mine:
            break
        time.sleep(0.1)
    assert mine and mine[-1]["status"] == 200 and mine[-1]["replica"] == r.headers["x-inferctl-replica"]
    assert mine[-1]["duration_seconds"] > 0


def _json_lines(log, request_id: str, logger: str | None = None, timeout: float = 5) -> list[dict]:
    """The JSON log lines of ``log`` that carry ``request_id`` (and come from ``logger``), waiting
    up to ``timeout`` s for one; every line that starts with ``{`` must parse."""
    deadline = time.monotonic() + timeout
    while True:
        docs = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        mine = [d for d in docs if d.get("request_id") == request_id and logger in (None, d["logger"])]
        if mine or time.monotonic() > deadline:
            return mine
        time.sleep(0.1)


def test_one_request_id_in_the_routers_and_the_engines_json_logs(fleet):
    """Issue 9: the X-Request-Id travels router -> engine -> both JSON logs (and the engine's /stats)."""
    r = httpx.post(fleet["base"] + "/v1/completions", headers={"X-Request-Id": "e2e-trace-9"},
                   json={"model": STORIES, "prompt": PROMPT, "max_tokens": 5, "temperature": 0}, timeout=30)
    assert r.status_code == 200 and r.headers["x-request-id"] == "e2e-trace-9"
    replica = r.headers["x-inferctl-replica"]
    engine = fleet["engines"][replica]
    [routed] = _json_lines(fleet["log"], "e2e-trace-9")
    assert routed["replica"] == replica and routed["status"] == 200
    [served] = _json_lines(engine["log"], "e2e-trace-9", "inferctl.engine.requests")
    assert served["id"] == r.json()["id"] and served["status"] == 200 and served["stream"] is False
    assert served["completion_tokens"] == r.json()["usage"]["completion_tokens"] == 5
    assert served["prompt_tokens"] == r.json()["usage"]["prompt_tokens"]
    other = next(e for n, e in fleet["engines"].items() if n != replica)
    assert _json_lines(other["log"], "e2e-trace-9", timeout=0) == []
    recent = httpx.get(engine["url"] + "/stats", timeout=5).json()["requests"]["recent"]
    assert [q["request_id"] for q in recent if q["x_request_id"] == "e2e-trace-9"] == [r.json()["id"]]


def test_the_engines_line_of_a_stream_the_client_left_says_so(fleet):
    body = {"model": STORIES, "prompt": PROMPT, "max_tokens": 480, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", fleet["base"] + "/v1/completions", json=body,
                      headers={"X-Request-Id": "e2e-gone-9"}) as r:
            replica = r.headers["x-inferctl-replica"]
            next(r.iter_raw())
    [served] = _json_lines(fleet["engines"][replica]["log"], "e2e-gone-9", "inferctl.engine.requests", timeout=10)
    assert served["client_disconnect"] is True and served["stream"] is True
    assert served["finish_reasons"] == [None]      # the choice never finished: aborted


def _metric(base: str, name: str, labels: str) -> float:
    for line in httpx.get(base + "/metrics", timeout=5).text.splitlines():
        if line.startswith(f"{name}{{{labels}}}"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_client_disconnect_closes_the_upstream_stream(fleet):
    body = {"model": STORIES, "prompt": PROMPT, "max_tokens": 480, "stream": True, "ignore_eos": True}
    aborted = {n: httpx.get(e["url"] + "/stats", timeout=5).json()["requests"]["aborted_total"]
               for n, e in fleet["engines"].items()}
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", fleet["base"] + "/v1/completions", json=body) as r:
            replica = r.headers["x-inferctl-replica"]
            next(r.iter_raw())         # the first chunk arrived, then the client goes away
    engine = fleet["engines"][replica]["url"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = httpx.get(engine + "/stats", timeout=5).json()
        gone = _metric(fleet["base"], "inferctl_router_client_disconnects_total", f'replica="{replica}"')
        if stats["scheduler"]["running"] == 0 and gone >= 1:
            break
        time.sleep(0.1)
    assert stats["scheduler"]["running"] == 0 and gone >= 1
    # the replica aborted the request (it did not run the 480 tokens to the end)
    assert stats["requests"]["aborted_total"] == aborted[replica] + 1
    assert _metric(fleet["base"], "inferctl_router_outstanding_requests", f'replica="{replica}"') == 0


def test_a_client_that_leaves_a_non_streamed_request_aborts_it_on_the_replica(fleet):
    """Issue 9, "client disconnects propagated to the replica", for a non-streamed request: the
    router (uvicorn) sees the client's socket close while it waits for the answer and closes its
    upstream connection, so the engine aborts the generation instead of running 480 tokens for
    nobody (before: finish_reason length, no abort counted anywhere)."""
    body = json.dumps({"model": STORIES, "prompt": PROMPT, "max_tokens": 480, "ignore_eos": True}).encode()
    urls = {n: e["url"] for n, e in fleet["engines"].items()}
    aborted = {n: httpx.get(u + "/stats", timeout=5).json()["requests"]["aborted_total"] for n, u in urls.items()}
    host, port = fleet["base"].removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    try:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Type: application/json"
                     b"\r\nX-Request-Id: e2e-left-9\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline, replica = time.monotonic() + 10, None
        while replica is None and time.monotonic() < deadline:
            replica = next((n for n, u in urls.items()
                            if httpx.get(u + "/stats", timeout=5).json()["scheduler"]["running"] == 1), None)
    finally:
        sock.close()                   # the client goes away mid-generation, no answer read
    assert replica is not None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = httpx.get(urls[replica] + "/stats", timeout=5).json()
        gone = _metric(fleet["base"], "inferctl_router_client_disconnects_total", f'replica="{replica}"')
        if stats["scheduler"]["running"] == 0 and stats["requests"]["aborted_total"] > aborted[replica]:
            break
        time.sleep(0.05)
    assert stats["scheduler"]["running"] == 0
    assert stats["requests"]["aborted_total"] == aborted[replica] + 1
    [mine] = [q for q in stats["requests"]["recent"] if q["x_request_id"] == "e2e-left-9"]
    assert mine["finish_reason"] == "abort" and mine["completion_tokens"] < 480
    [served] = _json_lines(fleet["engines"][replica]["log"], "e2e-left-9", "inferctl.engine.requests")
    assert served["client_disconnect"] is True and served["stream"] is False
    [routed] = _json_lines(fleet["log"], "e2e-left-9", "inferctl.router.access")
    assert routed["status"] == 499 and routed["client_disconnect"] is True and routed["replica"] == replica
    assert gone >= 1
    assert _metric(fleet["base"], "inferctl_router_outstanding_requests", f'replica="{replica}"') == 0


def test_a_router_with_its_own_key_from_the_environment_guards_v1_over_real_http(fleet, tmp_path):
    """``INFERCTL_API_KEY=KEY inferctl router``: the engine's 401 without the key, the official client
    with it, probes and scrapes open (the engines behind it have no key: the check is the router's)."""
    key = "sk-router-e2e-0123"
    port = free_port()
    log = tmp_path / "keyed-router.log"
    proc = start_inferctl(["router", "--port", str(port), "--probe-interval", "0.2",
                           "--engine", f"r0={fleet['engines']['r0']['url']}"], log,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "INFERCTL_API_KEY": key})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base + "/ready", proc, log, timeout=60)
        assert [httpx.get(base + p, timeout=5).status_code for p in ("/health", "/ready", "/metrics")] == [200] * 3
        r = httpx.post(base + "/v1/completions", json={"model": STORIES, "prompt": PROMPT, "max_tokens": 2})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"] == {"message": "missing API key: send 'Authorization: Bearer <key>'",
                                     "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=30)
        assert good.completions.create(model=STORIES, prompt=PROMPT, max_tokens=3).usage.completion_tokens == 3
        assert key not in log.read_text()
    finally:
        stop_all([proc], grace=15)


def test_a_killed_replica_is_routed_around(fleet, oai):
    victim = fleet["engines"]["r1"]["proc"]
    victim.kill()
    victim.wait(10)
    answers = [oai.completions.create(model=STORIES, prompt=f"{PROMPT} {i}", max_tokens=4) for i in range(6)]
    assert all(a.choices[0].text is not None for a in answers)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and httpx.get(fleet["base"] + "/ready").json()["replicas_ready"] != 1:
        time.sleep(0.1)
    state = httpx.get(fleet["base"] + "/replicas").json()
    assert state["r1"]["routable"] is False and state["r1"]["reason"] == "down"
    assert state["r0"]["routable"] is True


def test_up_router_env_gives_clients_one_key_in_front_of_an_engine_with_its_own(fleet, stories_dir, tmp_path):
    """The environment ``inferctl up`` builds for its router (``router_env``: the shell's
    ``$INFERCTL_API_KEY`` at the front door, the engines' ``launch.api_key`` upstream), over real
    processes: the client holds only the front key, the engine only accepts its own, and the
    tokenizer routes pass through."""
    from inferctl.controller.config import parse_config
    from inferctl.controller.router_launch import UPSTREAM_KEY_ENV, RouterSpec, router_argv, router_env

    front, engine_key = "sk-front-e2e-0123", "sk-engine-e2e-4567"
    eport, rport = free_port(), free_port()
    base_env = {k: v for k, v in os.environ.items() if k != "INFERCTL_API_KEY"}
    cfg = parse_config({"engines": [{"name": "k0", "launch": {"port": eport, "api_key": engine_key}}]})
    env = router_env(cfg, environ={**base_env, "INFERCTL_API_KEY": front})
    assert env == {"INFERCTL_API_KEY": front, UPSTREAM_KEY_ENV: engine_key}
    engine_url = f"http://127.0.0.1:{eport}"
    elog, rlog = tmp_path / "k0.log", tmp_path / "front-router.log"
    engine = start_inferctl(["engine", "serve", "--model", str(stories_dir / "stories260K.bin"), "--port", str(eport),
                             "--max-model-len", "512", "--memory-budget", "512MiB"], elog,
                            env={**base_env, "OMP_NUM_THREADS": "1", "INFERCTL_API_KEY": engine_key})
    procs = [engine]
    try:
        wait_ready(engine_url + "/health", engine, elog, timeout=60)
        argv = router_argv(RouterSpec(port=rport), [("k0", engine_url)], "http://127.0.0.1:9", UPSTREAM_KEY_ENV)
        argv = argv[argv.index("router"):]
        router = start_inferctl(argv + ["--probe-interval", "0.2"], rlog,
                                env={**base_env, "OMP_NUM_THREADS": "1", **env})
        procs.append(router)
        base = f"http://127.0.0.1:{rport}"
        wait_ready(base + "/ready", router, rlog, timeout=60)
        client = openai.OpenAI(base_url=base + "/v1", api_key=front, max_retries=0, timeout=30)
        assert [m.id for m in client.models.list().data] == [STORIES]
        assert client.completions.create(model=STORIES, prompt=PROMPT, max_tokens=3).usage.completion_tokens == 3
        with pytest.raises(openai.AuthenticationError):      # the engine's key does not open the front door
            openai.OpenAI(base_url=base + "/v1", api_key=engine_key, max_retries=0).models.list()
        direct = httpx.post(engine_url + "/v1/completions", headers={"Authorization": f"Bearer {front}"},
                            json={"model": STORIES, "prompt": PROMPT, "max_tokens": 2}, timeout=30)
        assert direct.status_code == 401                      # nor the front key the engine's
        tok = httpx.post(base + "/tokenize", json={"prompt": PROMPT}, timeout=30)
        assert tok.status_code == 200 and tok.json()["count"] == len(tok.json()["tokens"]) > 1
        bad = httpx.post(base + "/detokenize", json={"tokens": [10 ** 6]}, timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens[0]"
        assert front not in rlog.read_text() and engine_key not in rlog.read_text()
    finally:
        stop_all(procs, grace=15)
