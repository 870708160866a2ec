"""bench/reference_proxy.py (the HAProxy reference beside the router in ``python -m bench.router``'s
overhead part) and the reference columns and sentences of bench.router's ``render_overhead``.

The tests with the real HAProxy binary are in tests/contract/test_reference_proxy_haproxy.py."""

import socket
import time

import pytest

from bench import reference_proxy  # noqa: F401
from inferctl.router import dataplane
from bench.reference_proxy import find_haproxy, haproxy_config, haproxy_version, start_haproxy
from bench.router import render_overhead


def _executable(path, text="#!/bin/sh\nexit 0\n"):
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- haproxy_config ---------------------------------------------------------------------------

def test_the_config_listens_on_loopback_and_forwards_to_the_upstream_keeping_connections_and_buffering():
    lines = [line.strip() for line in haproxy_config(18123, "http://127.0.0.1:9031").splitlines()]
    assert "bind 127.0.0.1:18123" in lines
    assert "server engine 127.0.0.1:9031" in lines
    assert "option http-buffer-request" in lines
    assert "http-reuse always" in lines
    assert "nbthread 1" in lines
    assert "mode http" in lines
    # the bind is in the frontend, the server line in the backend it defaults to
    assert lines.index("frontend reference") < lines.index("bind 127.0.0.1:18123") < lines.index("backend engine")
    assert lines.index("backend engine") < lines.index("server engine 127.0.0.1:9031")
    assert "default_backend engine" in lines


def test_the_config_takes_the_upstream_host_name_and_port_from_the_url():
    cfg = haproxy_config(1, "http://engine-0.local:65535/")
    assert "    server engine engine-0.local:65535" in cfg.splitlines()
    assert "    bind 127.0.0.1:1" in cfg.splitlines()


@pytest.mark.parametrize("upstream", ["https://127.0.0.1:9031", "http://127.0.0.1", "127.0.0.1:9031", "garbage",
                                      "http://:9031", "http://127.0.0.1:0", ""])
def test_an_upstream_that_is_not_http_host_port_is_refused_naming_it(upstream):
    with pytest.raises(ValueError, match="upstream must be http://HOST:PORT") as err:
        haproxy_config(18123, upstream)
    assert repr(upstream) in str(err.value)


@pytest.mark.parametrize("upstream", ["http://127.0.0.1:abc", "http://127.0.0.1:70000"])
def test_an_upstream_with_an_unreadable_port_is_refused(upstream):
    with pytest.raises(ValueError, match=r"upstream must be http://HOST:PORT, got 'http://127\.0\.0\.1:"):
        haproxy_config(18123, upstream)


def test_an_ipv6_upstream_is_written_in_brackets():
    assert "    server engine [::1]:8000\n" in haproxy_config(18123, "http://[::1]:8000")


@pytest.mark.parametrize("port", [True, 8080.5, "8080"])
def test_a_listening_port_that_is_not_an_int_is_refused(port):
    with pytest.raises(ValueError, match="port must be 1..65535"):
        haproxy_config(port, "http://127.0.0.1:9031")


@pytest.mark.parametrize("port", [0, 70000, -1, 65536])
def test_a_listening_port_outside_1_to_65535_is_refused_naming_it(port):
    with pytest.raises(ValueError, match=f"port must be 1..65535, got {port}$"):
        haproxy_config(port, "http://127.0.0.1:9031")


# --- find_haproxy -----------------------------------------------------------------------------

def test_find_haproxy_none_means_no_reference_even_when_one_is_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERCTL_HAPROXY", _executable(tmp_path / "haproxy"))
    assert find_haproxy("none") is None


def test_find_haproxy_refuses_a_path_that_is_not_an_executable_file_naming_the_option(tmp_path):
    plain = tmp_path / "haproxy.txt"
    plain.write_text("not a program", encoding="utf-8")
    plain.chmod(0o644)
    for spec in (str(plain), str(tmp_path), str(tmp_path / "missing")):
        with pytest.raises(FileNotFoundError, match="--reference-proxy") as err:
            find_haproxy(spec)
        assert repr(spec) in str(err.value) and "not an executable file" in str(err.value)


def test_find_haproxy_returns_an_executable_path_as_given(tmp_path):
    binary = _executable(tmp_path / "my-haproxy")
    assert find_haproxy(binary) == binary


def test_find_haproxy_auto_prefers_the_environment_variable(tmp_path, monkeypatch):
    on_path = tmp_path / "bin"
    on_path.mkdir()
    _executable(on_path / "haproxy")
    chosen = _executable(tmp_path / "chosen-haproxy")
    monkeypatch.setenv("INFERCTL_HAPROXY", chosen)
    monkeypatch.setenv("PATH", str(on_path))
    assert find_haproxy("auto") == chosen
    assert find_haproxy() == chosen                         # auto is the default


def test_find_haproxy_auto_skips_a_non_executable_environment_value_for_the_one_on_path(tmp_path, monkeypatch):
    on_path = tmp_path / "bin"
    on_path.mkdir()
    found = _executable(on_path / "haproxy")
    plain = tmp_path / "plain"
    plain.write_text("", encoding="utf-8")
    plain.chmod(0o644)
    monkeypatch.setenv("INFERCTL_HAPROXY", str(plain))
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.setattr(dataplane, "DEBIAN_PATH", str(tmp_path / "absent"))
    assert find_haproxy("auto") == found


def test_find_haproxy_auto_falls_back_to_the_debian_path(tmp_path, monkeypatch):
    debian = _executable(tmp_path / "sbin-haproxy")
    monkeypatch.delenv("INFERCTL_HAPROXY", raising=False)
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(dataplane, "DEBIAN_PATH", debian)
    assert find_haproxy("auto") == debian


def test_find_haproxy_auto_without_any_haproxy_is_none(tmp_path, monkeypatch):
    monkeypatch.delenv("INFERCTL_HAPROXY", raising=False)
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(dataplane, "DEBIAN_PATH", str(tmp_path / "no-such-haproxy"))
    assert find_haproxy("auto") is None


# --- start_haproxy / haproxy_version without the real binary -----------------------------------

def test_start_haproxy_raises_with_the_checkers_output_when_the_config_is_refused(tmp_path):
    fake = _executable(tmp_path / "fake-haproxy", "#!/bin/sh\necho \"[ALERT] parsing: bad line\" >&2\nexit 1\n")
    with pytest.raises(RuntimeError, match=r"haproxy -c refused .*haproxy\.cfg: \[ALERT\] parsing: bad line"):
        start_haproxy(fake, 18123, "http://127.0.0.1:9031", tmp_path)
    assert "bind 127.0.0.1:18123" in (tmp_path / "haproxy.cfg").read_text(encoding="utf-8")
    assert not (tmp_path / "haproxy.log").exists()          # nothing was started


def test_start_haproxy_raises_with_its_output_when_it_exits_at_start(tmp_path):
    # passes the check (-c), then exits at once as HAProxy does when the file limit is too low
    fake = _executable(tmp_path / "fake-haproxy", "#!/bin/sh\n[ \"$1\" = -c ] && exit 0\n"
                       "echo '[ALERT] Cannot raise FD limit to 8206, limit is 1024.' >&2\nexit 1\n")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"exited with status 1: \[ALERT\] Cannot raise FD limit to 8206"):
        start_haproxy(fake, _free_port(), "http://127.0.0.1:9031", tmp_path, timeout=20)
    assert time.monotonic() - t0 < 10                     # noticed at once, not after the timeout


def test_start_haproxy_stops_one_that_never_listens(tmp_path):
    fake = _executable(tmp_path / "fake-haproxy", "#!/bin/sh\n[ \"$1\" = -c ] && exit 0\nexec sleep 60\n")
    with pytest.raises(RuntimeError, match=r"did not listen on 127\.0\.0\.1:\d+ in 0\.5 s: no output"):
        start_haproxy(fake, _free_port(), "http://127.0.0.1:9031", tmp_path, timeout=0.5)


def test_maxconn_is_written_and_bounded():
    assert "    maxconn 4096\n" in haproxy_config(18123, "http://127.0.0.1:9031")
    assert "    maxconn 130\n" in haproxy_config(18123, "http://127.0.0.1:9031", maxconn=130)
    for bad in (0, 100_001):
        with pytest.raises(ValueError, match=rf"maxconn must be 1\.\.100000, got {bad}"):
            haproxy_config(18123, "http://127.0.0.1:9031", maxconn=bad)


def test_haproxy_version_is_the_third_word_of_the_first_line_or_just_haproxy(tmp_path):
    good = _executable(tmp_path / "good", "#!/bin/sh\necho 'HAProxy version 2.8.5-1 2023/12/01 - https://x'\n")
    other = _executable(tmp_path / "other", "#!/bin/sh\necho 'nginx version: 1.2'\n")
    silent = _executable(tmp_path / "silent")
    assert haproxy_version(good) == "HAProxy 2.8.5-1"
    assert haproxy_version(other) == "HAProxy"
    assert haproxy_version(silent) == "HAProxy"


# --- render_overhead's reference columns --------------------------------------------------------

def _round(direct, router, ref, errors, ref_errors, ref_cpu, k):
    """A round of measure_overhead's dict (seconds); ``k`` keeps every other figure distinct."""
    return {"direct_p50": direct, "direct_p99": 2 * direct + 0.001 * k, "router_p50": router,
            "router_p99": 2 * router + 0.002 * k, "added_p50": router - direct,
            "added_p99": 2 * (router - direct) + 0.001 * k, "direct_rps": 900.0 + k, "router_rps": 700.0 + k,
            "errors": errors, "n": 2048, "router_own_mean": 0.0003 + 0.0001 * k, "router_own_p50": 0.00025,
            "router_own_p99": 0.0009, "router_cpu_ms_per_req": 0.7 + 0.11 * k,
            "client_cpu_ms_per_req_direct": 0.9, "client_cpu_ms_per_req_routed": 1.1,
            "engine_cpu_ms_per_req_direct": 4.5 + k, "engine_cpu_ms_per_req_routed": 4.7 + k,
            "seqs_per_step_direct": 30.0 + k, "seqs_per_step_routed": 28.0 + k,
            "reference_p50": ref, "reference_p99": 2 * ref, "reference_added_p50": ref - direct,
            "reference_cpu_ms_per_req": ref_cpu, "reference_errors": ref_errors}


def _with_reference():
    over = [_round(0.0101, 0.0153, 0.01137, 1, 2, 0.12, 1),      # added 5.20, reference added 1.27
            _round(0.0120, 0.0188, 0.01343, 0, 4, 0.34, 2),      # added 6.80, reference added 1.43
            _round(0.0110, 0.0151, 0.01219, 5, 0, 0.23, 3)]      # added 4.10, reference added 1.19
    seq = [{"direct_p50": 0.0021, "router_p50": 0.0029, "added_p50": 0.0008, "reference_added_p50": 0.00011},
           {"direct_p50": 0.0022, "router_p50": 0.0031, "added_p50": 0.0009, "reference_added_p50": 0.00017},
           {"direct_p50": 0.0020, "router_p50": 0.0027, "added_p50": 0.0007, "reference_added_p50": 0.00014}]
    return {"overhead": over, "sequential": seq, "clients": 64, "per_client": 16, "pinned": [[0], [1]],
            "reference": "HAProxy 2.6.12-1+deb12u3"}


def _table(text):
    return [line for line in text.splitlines() if line.startswith("|")]


def test_render_overhead_adds_the_reference_columns_after_the_errors_column():
    table = _table(render_overhead(_with_reference()))
    assert table[0].endswith("| errors | reference p50 | reference added p50 | reference CPU ms/req |")
    assert len(table) == 2 + 3
    assert all(row.count("|") == table[0].count("|") for row in table[2:])


def test_render_overhead_rows_show_the_reference_figures_in_ms_and_the_errors_of_both():
    rows = _table(render_overhead(_with_reference()))[2:]
    # errors = router's + reference's; then reference p50, reference added p50 (ms), reference CPU ms/req
    assert rows[0].startswith("| 1 | 10.10 | 15.30 | 5.20 |")
    assert rows[0].endswith("| 3 | 11.37 | 1.27 | 0.12 |")
    assert rows[1].startswith("| 2 | 12.00 | 18.80 | 6.80 |")
    assert rows[1].endswith("| 4 | 13.43 | 1.43 | 0.34 |")
    assert rows[2].startswith("| 3 | 11.00 | 15.10 | 4.10 |")
    assert rows[2].endswith("| 5 | 12.19 | 1.19 | 0.23 |")


def test_render_overhead_says_the_reference_median_and_how_far_the_router_is_above_it():
    text = render_overhead(_with_reference())
    assert "**added p50 5.20 ms**" in text                  # the router's median (5.20, 6.80, 4.10)
    assert "**The same rounds through HAProxy 2.6.12-1+deb12u3**" in text
    assert "added p50 median **1.27 ms** (rounds 1.27, 1.43, 1.19)" in text
    assert "0.230 ms of CPU a request" in text              # median of 0.12, 0.34, 0.23
    assert "the router's median is 3.93 ms above it." in text    # 5.20 - 1.27
    # the sequential line: the router's median, then the reference's (0.11, 0.17, 0.14)
    assert "median of the rounds' added p50 **0.80 ms** (HAProxy 2.6.12-1+deb12u3: 0.14 ms)." in text
    # the reference sentence follows the verdict, within the same paragraph
    verdict = next(p for p in text.split("\n\n") if p.startswith("Median over the rounds"))
    assert verdict.index("**Target not met**") < verdict.index("**The same rounds through")


def test_render_overhead_without_a_reference_has_no_reference_column_or_sentence():
    res = _with_reference()
    res["reference"] = None
    # measure_overhead without a reference: no reference_* keys in the rounds or the sequential runs
    res["overhead"] = [{k: v for k, v in o.items() if not k.startswith("reference")} for o in res["overhead"]]
    res["sequential"] = [{k: v for k, v in q.items() if not k.startswith("reference")} for q in res["sequential"]]
    text = render_overhead(res)
    table = _table(text)
    assert table[0].endswith("| batch | errors |")
    assert [row.rsplit("|", 2)[1].strip() for row in table[2:]] == ["1", "0", "5"]   # the router's errors only
    assert "reference" not in text and "HAProxy" not in text and "The same rounds through" not in text
    assert "median of the rounds' added p50 **0.80 ms**." in text
    assert "**added p50 5.20 ms**" in text


# --- the turning order and the split of the added time ------------------------------------------

def test_turned_puts_each_part_once_in_each_place_over_len_rounds():
    from bench.router import turned

    parts = ["direct", "routed", "referenced"]
    orders = [turned(parts, k) for k in range(3)]
    assert orders == [["direct", "routed", "referenced"], ["routed", "referenced", "direct"],
                      ["referenced", "direct", "routed"]]
    assert turned(parts, 4) == orders[1]
    assert turned(["direct", "routed"], 1) == ["routed", "direct"]
    with pytest.raises(ValueError, match="no parts"):
        turned([], 0)


def _split_round(direct, router, upstream, ref=None, ref_tr=None):
    o = {"direct_mean": direct, "router_mean": router, "router_upstream_mean": upstream}
    if ref is not None:
        o.update(reference_mean=ref, reference_upstream_mean=ref_tr)
    return o


def test_split_table_gives_each_proxys_part_and_the_engines_with_their_medians():
    from bench.router import split_table

    res = {"reference": "HAProxy 2.6.12", "overhead": [
        _split_round(0.060, 0.066, 0.061, 0.075, 0.071),     # router 5 / engine 1; ref 4 / engine 11
        _split_round(0.070, 0.068, 0.062, 0.080, 0.076),     # router 6 / engine -8; ref 4 / engine 6
        _split_round(0.050, 0.059, 0.052, 0.055, 0.052)]}    # router 7 / engine 2; ref 3 / engine 2
    text = "\n".join(split_table(res))
    assert "| 1 | 60.00 | 66.00 | 61.00 | 5.00 | 1.00 | 75.00 | 71.00 | 4.00 | 11.00 |" in text
    assert "| 2 | 70.00 | 68.00 | 62.00 | 6.00 | -8.00 | 80.00 | 76.00 | 4.00 | 6.00 |" in text
    assert ("the router's part **6.00 ms**, the engine's part **1.00 ms**; HAProxy 2.6.12: its part"
            " **4.00 ms**, the engine's part **6.00 ms**") in text


def test_split_table_without_a_reference_or_without_means():
    from bench.router import split_table

    res = {"reference": None, "overhead": [_split_round(0.060, 0.066, 0.061)]}
    text = "\n".join(split_table(res))
    assert "| 1 | 60.00 | 66.00 | 61.00 | 5.00 | 1.00 |" in text and "reference" not in text.split("\n\n")[1]
    assert "HAProxy" not in text
    # rounds recorded before the split (no means) give no table at all
    assert split_table({"reference": None, "overhead": [{"direct_p50": 0.05}]}) == []


def test_split_table_keeps_each_rounds_own_number_when_one_has_no_means():
    from bench.router import split_table

    res = {"reference": None, "overhead": [_split_round(0.060, 0.066, 0.061), _split_round(0.070, 0.071, None),
                                           _split_round(0.050, 0.059, 0.052)]}
    text = "\n".join(split_table(res))
    assert "| 1 | 60.00 | 66.00 |" in text and "| 3 | 50.00 | 59.00 | 52.00 | 7.00 | 2.00 |" in text
    assert "| 2 |" not in text


def test_server_times_reads_only_whole_ascii_numbers_and_a_missing_log_is_empty(tmp_path):
    from bench.reference_proxy import server_times, timings_seen

    assert server_times(tmp_path / "none.log", 0, 0, wait=0) == []
    log = tmp_path / "haproxy.log"
    log.write_text("inferctl-timing -1 0\ninferctl-timing 12 13\ngarbage\ninferctl-timing \u00b2 3\n"
                   "inferctl-timing 7\ninferctl-timing 40 41\n", encoding="utf-8")
    assert server_times(log, 0, 2, wait=0) == [12.0, 40.0]
    assert server_times(log, 2, 1, wait=0) == [40.0]       # after the first two timing lines
    assert timings_seen(log) == 5


def test_a_server_that_exits_before_ready_is_said_at_once_with_its_log(tmp_path):
    import subprocess
    import sys

    from bench.router_affinity import wait

    log = tmp_path / "engine-0.log"
    log.write_text("loading\nerror: --device: 'cuda' asked for but CUDA is not available\n", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
    proc.wait()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"the server exited with 2 before it was ready: loading \| error: "
                                           r"--device: 'cuda' asked for"):
        wait(f"http://127.0.0.1:{_free_port()}/ready", timeout=60, proc=proc, log=log)
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("argv,says", [(["--reference-proxy", "/nonexistent/haproxy"], "is not an executable file"),
                                       (["--rounds", "0"], "must be at least 1, got 0")])
def test_bad_bench_flags_are_exit_2_before_anything_starts(argv, says, capsys):
    from bench.router import main

    with pytest.raises(SystemExit) as exc:
        main(["--overhead-only", *argv])
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


def test_fitting_maxconn_follows_the_hard_open_file_limit(monkeypatch):
    import resource

    from bench.reference_proxy import fitting_maxconn

    monkeypatch.setattr(resource, "getrlimit", lambda _r: (1024, 1024))
    assert fitting_maxconn(4096) == (1024 - 64) // 2 == 480
    monkeypatch.setattr(resource, "getrlimit", lambda _r: (1024, 65536))
    assert fitting_maxconn(4096) == 4096
    monkeypatch.setattr(resource, "getrlimit", lambda _r: (64, 100))
    assert fitting_maxconn(4096) == 64
    monkeypatch.setattr(resource, "getrlimit", lambda _r: (1024, resource.RLIM_INFINITY))
    assert fitting_maxconn(5000) == 5000
