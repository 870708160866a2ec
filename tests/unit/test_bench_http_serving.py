"""bench.http_serving's pure parts: the table/verdict from results, the py-spy summary."""

from bench.http_serving import paired_ratio, render, summarize_profile
from bench.runners import RunResult


def _r(side, tokens, seconds, cpu, client=None):
    extra = {"cpu_s": cpu}
    if client is not None:
        extra.update(server_cpu_s=cpu, client_cpu_s=client)
    return RunResult(side=side, model="m", batch=32, requests=32, useful_tokens=tokens, seconds=seconds,
                     latencies=[seconds], extra=extra)


def test_render_takes_the_best_round_and_states_the_verdict():
    res = {"in-process": [_r("in-process", 1000, 2.0, 1.0), _r("in-process", 1000, 1.0, 1.0)],
           "async": [_r("async", 1000, 1.25, 1.1)],
           "http": [_r("http", 1000, 2.0, 2.0, 0.1), _r("http", 1000, 1.6, 1.6, 0.1)]}
    text = render("m", res, None)
    assert "HTTP / in-process: **62 %** (target ≥ 80%: NOT met)" in text   # 625 / 1000 tok/s
    assert "async / in-process 80 %" in text
    assert "in-process ÷ HTTP server" in text and "**62 %**" in text        # 1.0 / 1.6 CPU s
    res["http"].append(_r("http", 1000, 1.1, 1.2, 0.1))
    assert "**91 %** (target ≥ 80%: met)" in render("m", res, None)


def test_paired_ratio_is_the_median_of_each_rounds_own_ratio():
    # rounds: in-process 1000, 500, 800 tok/s; http 700, 450, 400 -> ratios 0.7, 0.9, 0.5 -> median 0.7;
    # median to median 450 / 800 = 56 %, best to best 700 / 1000 = 70 %
    res = {"in-process": [_r("in-process", 1000, s, 1.0) for s in (1.0, 2.0, 1.25)],
           "async": [_r("async", 1000, 1.0, 1.0)],
           "http": [_r("http", 1000, s, 1.0, 0.1) for s in (1 / 0.7, 1 / 0.45, 1 / 0.4)]}
    assert abs(paired_ratio(res) - 0.7) < 1e-9
    text = render("m", res, None)
    assert "HTTP / in-process: **70 %**" in text
    assert "median to median **56 %**" in text and "own ratio **70 %**" in text


def test_summarize_profile_counts_threads_and_frames(tmp_path):
    raw = tmp_path / "p.txt"
    raw.write_text("thread (1): MainThread;run (a.py:1);send (b.py:2) 30\n"
                   "thread (2): step;step (e.py:3);matmul (m.py:4) 70\n")
    text = summarize_profile(raw)
    assert text.startswith("100 samples")
    assert "thread (2): step: 70 (70 %)" in text
    assert "30.0 %  send (b.py:2)" in text
