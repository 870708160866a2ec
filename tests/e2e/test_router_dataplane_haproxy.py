"""``inferctl router --data-plane haproxy`` end to end: two real engines (stories260K), the real
HAProxy (Debian package ``haproxy``; .ci/run installs it; without it these fail, as the Prometheus
tests do without promtool), the official ``openai`` client. The tests run in file order: the last
two kill the replicas."""

import json
import os
import signal
import socket
import subprocess
import time

import httpx
import openai
import pytest

from inferctl.router.dataplane import find_haproxy
from tests.server_helpers import STORIES, free_port, start_inferctl, stop_all, wait_ready

#: longer than --affinity-chars (256): prompts sharing it share their affinity key
LONG = ("Once upon a time there was a little girl named Lily. She liked to play in the park with her "
        "friends every day, and ") * 3


@pytest.fixture(scope="module")
def fleet(stories_dir, tmp_path_factory):
    if find_haproxy("auto") is None:
        pytest.fail("haproxy not installed (the Debian haproxy package; .ci/run installs it)")
    tmp = tmp_path_factory.mktemp("dataplane")
    procs, engines = {}, {}
    for name in ("e0", "e1"):
        port = free_port()
        procs[name] = start_inferctl(["engine", "serve", "--model", str(stories_dir / "stories260K.bin"),
                                      "--port", str(port), "--device", "cpu"], tmp / f"{name}.log")
        engines[name] = f"http://127.0.0.1:{port}"
    for name, url in engines.items():
        wait_ready(f"{url}/ready", procs[name], tmp / f"{name}.log")
    port = free_port()
    router = start_inferctl(["router", "--data-plane", "haproxy", "--port", str(port), "--probe-interval", "0.5",
                             "--allowed-host", "api.example.com", "--max-body-bytes", "1KiB",
                             *[a for n, u in engines.items() for a in ("--engine", f"{n}={u}")]],
                            tmp / "router.log", ready_url=f"http://127.0.0.1:{port}/ready")
    yield {"url": f"http://127.0.0.1:{port}", "port": port, "router": router, "engines": engines, "procs": procs,
           "tmp": tmp}
    stop_all([router, *procs.values()])


def _ready_count(url):
    return httpx.get(f"{url}/ready", timeout=2).json().get("replicas_ready")


def _wait_ready_count(url, want, timeout=10):
    deadline = time.monotonic() + timeout
    while _ready_count(url) != want:
        assert time.monotonic() < deadline, f"replicas_ready never became {want}"
        time.sleep(0.1)


def _metric(url, line_start):
    for line in httpx.get(f"{url}/metrics", timeout=2).text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_openai_client_works_through_the_haproxy_data_plane(fleet):
    client = openai.OpenAI(base_url=f"{fleet['url']}/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model=STORIES, prompt="Once upon a time", max_tokens=12, temperature=0)
    assert done.usage.completion_tokens == 12 and done.choices[0].text
    chat = client.chat.completions.create(model=STORIES, messages=[{"role": "user", "content": "Hello"}],
                                          max_tokens=6, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 6
    chunks = list(client.completions.create(model=STORIES, prompt="Once upon a time", max_tokens=10,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == client.completions.create(
        model=STORIES, prompt="Once upon a time", max_tokens=10, temperature=0).choices[0].text
    assert [m.id for m in client.models.list().data] == [STORIES]       # the control plane's union


def test_a_shared_prompt_prefix_and_a_session_stay_on_one_replica(fleet):
    seen = set()
    for i in range(6):
        r = httpx.post(f"{fleet['url']}/v1/completions", timeout=30,
                       json={"model": STORIES, "prompt": LONG + f"turn {i}", "max_tokens": 2})
        assert r.status_code == 200
        seen.add(r.headers["x-inferctl-replica"])
    assert len(seen) == 1 and seen <= set(fleet["engines"])
    sessions = set()
    for i in range(6):
        r = httpx.post(f"{fleet['url']}/v1/completions", timeout=30, headers={"X-Session-Id": "conversation-7"},
                       json={"model": STORIES, "prompt": f"Hi {i}", "max_tokens": 2})
        sessions.add(r.headers["x-inferctl-replica"])
    assert len(sessions) == 1
    short = {httpx.post(f"{fleet['url']}/v1/completions", timeout=30,
                        json={"model": STORIES, "prompt": "Hi", "max_tokens": 1}).headers["x-inferctl-replica"]
             for _ in range(30)}
    assert short == set(fleet["engines"])            # keyless requests spread (30 random draws: 2^-29 to miss one)


def test_the_front_door_rules_match_the_python_router(fleet):
    url = f"{fleet['url']}/v1/completions"
    bad = httpx.post(url, json={"model": STORIES, "prompt": "x", "max_tokens": -2}, headers={"X-Request-Id": "rid-1"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"      # the engine's 4xx
    assert bad.headers["x-request-id"] == "rid-1"
    fresh = httpx.post(url, json={"model": STORIES, "prompt": "x", "max_tokens": 1})
    assert len(fresh.headers["x-request-id"]) == 32 and int(fresh.headers["x-request-id"], 16) >= 0
    host = httpx.post(url, json={"prompt": "x"}, headers={"Host": "evil.example"})
    assert host.status_code == 421 and host.json()["error"]["code"] == "host_not_allowed"
    assert len(host.headers["x-request-id"]) == 32
    big = httpx.post(url, content=b'{"prompt": "' + b"a" * (4 * 1024 * 1024) + b'"}',
                     headers={"Content-Type": "application/json"}, timeout=30)
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    assert _metric(fleet["url"], 'inferctl_router_requests_total{replica="') is not None


def test_only_a_post_to_a_hot_path_reaches_a_replica(fleet):
    url = fleet["url"]
    for method, path in (("POST", "/health"), ("POST", "/admin/precision"), ("GET", "/v1/completions"),
                         ("POST", "/v1/completions/"), ("POST", "/nonexist")):
        r = httpx.request(method, url + path, json={"mode": "int8"}, timeout=10)
        assert "x-inferctl-replica" not in r.headers, (method, path, r.status_code)      # the control plane's answer
        assert r.status_code in (404, 405, 307), (method, path, r.status_code)


def test_a_replica_bound_to_loopback_serves_a_client_that_used_an_allowed_name(fleet):
    r = httpx.post(f"{fleet['url']}/v1/completions", headers={"Host": "api.example.com"}, timeout=30,
                   json={"model": STORIES, "prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 200 and r.headers["x-inferctl-replica"] in fleet["engines"]


def test_body_limits_hold_for_a_declared_length_at_once_and_for_a_chunked_body(fleet):
    with socket.create_connection(("127.0.0.1", fleet["port"]), timeout=5) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 99999999\r\n\r\n{\"prompt\": \"x\"}")
        t0 = time.monotonic()
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 413") and time.monotonic() - t0 < 5
    chunks = (b'{"model": "stories260K", "prompt": "' + b"a" * 4000 + b'"}',)
    r = httpx.post(f"{fleet['url']}/v1/completions", content=iter(chunks),
                   headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert "x-inferctl-replica" not in r.headers


def test_the_first_of_two_request_ids_is_kept_as_the_python_router_does(fleet):
    r = httpx.post(f"{fleet['url']}/v1/completions", timeout=30,
                   json={"model": STORIES, "prompt": "Hi", "max_tokens": 1},
                   headers=[("X-Request-Id", "first-id"), ("X-Request-Id", "second-id")])
    assert r.status_code == 200 and r.headers["x-request-id"] == "first-id"


def test_a_second_router_on_a_taken_port_exits_3_saying_so(fleet):
    other = start_inferctl(["router", "--data-plane", "haproxy", "--port", str(fleet["port"]),
                            "--engine", f"x={fleet['engines']['e0']}"], fleet["tmp"] / "router-taken.log")
    assert other.wait(30) == 3
    assert "cannot listen on 127.0.0.1:" in (fleet["tmp"] / "router-taken.log").read_text()


def test_sigterm_lets_a_stream_in_flight_finish_then_exits_0(fleet):
    port = free_port()
    router = start_inferctl(["router", "--data-plane", "haproxy", "--port", str(port),
                             *[a for n, u in fleet["engines"].items() for a in ("--engine", f"{n}={u}")]],
                            fleet["tmp"] / "router2.log", ready_url=f"http://127.0.0.1:{port}/ready")
    haproxy = [int(p) for p in subprocess.run(["pgrep", "-P", str(router.pid)], capture_output=True,
                                              text=True).stdout.split()]
    assert haproxy, "no HAProxy child"
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                      json={"model": STORIES, "prompt": "Once upon a time", "max_tokens": 200, "stream": True}) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        router.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line.startswith("data:")]
    assert json.loads(first[5:])["choices"]
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][5:])["choices"][0]["finish_reason"] == "length"
    assert router.wait(30) == 0
    assert not any(os.path.exists(f"/proc/{pid}") for pid in haproxy)


def test_a_killed_replica_fails_no_request_that_had_not_started(fleet):
    url = fleet["url"]
    fleet["procs"]["e1"].kill()
    codes = [httpx.post(f"{url}/v1/completions", timeout=30,
                        json={"model": STORIES, "prompt": "Hi", "max_tokens": 1}).status_code for _ in range(20)]
    assert codes == [200] * 20
    _wait_ready_count(url, 1)


def test_no_ready_replica_is_a_503_with_the_routers_error(fleet):
    fleet["procs"]["e0"].kill()
    _wait_ready_count(fleet["url"], 0)
    r = httpx.post(f"{fleet['url']}/v1/completions", json={"model": STORIES, "prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_ready_replica"
    assert r.headers["retry-after"] == "1"
    assert httpx.get(f"{fleet['url']}/ready").status_code == 503
