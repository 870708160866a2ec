"""The runner's decode fast path (issue 12, wave 8; docs/performance.md) on the real stories260K
engine: a script with arrivals, finishes (max_tokens, a stop string), an abort, preemption by
recompute, a seeded sampled request and one asking for logprobs gives the same outputs (tokens,
logprobs, text, finish reasons), the same metrics and the same per-step activation reservations
with the fast path as with it turned off; the metadata it rewrites in place equals a fresh build at
every step; and its kept running set is rebuilt exactly when the set changes."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import generate_latest

from inferctl.engine import runner as runner_mod
from inferctl.engine.attention import AttentionMetadata
from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.sampling_params import SamplingParams

G = dict(temperature=0.0, ignore_eos=True)


def _script(engine: LLMEngine, trace: list) -> list:
    """Steps a fixed script; returns every output (and ``trace`` gets each step's running set)."""
    add = engine.add_request
    out = []
    add("a", list(range(3, 19)), SamplingParams(max_tokens=40, **G))
    for step in range(400):
        if step == 3:
            add("b", list(range(5, 40)), SamplingParams(max_tokens=30, **G))          # arrival mid-decode
        if step == 8:
            add("c", list(range(7, 20)), SamplingParams(max_tokens=25, temperature=0.9, seed=7, ignore_eos=True))
            add("d", list(range(9, 30)), SamplingParams(max_tokens=20, logprobs=2, **G))
        if step == 12:
            add("e", [1, 2, 3], SamplingParams(max_tokens=60, stop=["a"], temperature=0.0))
        if step == 20:
            engine.abort_request("b")
        if step == 22:
            add("f", list(range(11, 60)), SamplingParams(max_tokens=50, **G))        # pushes the pool to preempt
        if step > 22 and not engine.has_unfinished_requests():
            break
        for o in engine.step():
            out.append((o.request_id, o.new_token_ids, o.logprobs, o.new_text, o.finish_reason, o.top_logprobs))
        trace.append(tuple(s.request_id for s in engine.scheduler.running))
    return out


def _engine(bundle, fast: bool) -> LLMEngine:
    engine = LLMEngine(bundle, EngineConfig(num_kv_blocks=8, max_num_seqs=8, enable_prefix_caching=True))
    if not fast:
        slow = engine.runner.execute

        def execute(scheduled, drafts=None):
            engine.runner._decode = engine.runner._meta = None
            engine.runner._execute_decode = lambda scheduled: None
            return slow(scheduled, drafts)
        engine.runner.execute = execute
    acts: list[int] = []
    reserve = engine.accountant.reserve_activations
    engine.accountant.reserve_activations = lambda n: (acts.append(n), reserve(n))[1]
    engine._acts = acts
    return engine


def _counters(engine: LLMEngine) -> dict[str, str]:
    """The engine's /metrics counters (``*_total`` samples but time sums): they count events, not time."""
    text = generate_latest(engine.registry).decode()
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {k: v for k, v in pairs if "_total" in k and "seconds" not in k}


def test_the_fast_path_changes_no_output_metric_or_reservation(bundle):
    fast, slow = _engine(bundle, True), _engine(bundle, False)
    hits = []
    orig = runner_mod.ModelRunner._execute_decode

    def counted(self, scheduled):
        res = orig(self, scheduled)
        hits.append(res is not None)
        return res
    runner_mod.ModelRunner._execute_decode = counted
    try:
        ft, st = [], []
        a, b = _script(fast, ft), _script(slow, st)
    finally:
        runner_mod.ModelRunner._execute_decode = orig
    assert a == b and ft == st
    assert fast._acts == slow._acts
    assert fast.scheduler.preemptions_total == slow.scheduler.preemptions_total > 0
    assert {o[4] for o in a} >= {"length", "stop"}
    assert 0 < sum(len(o[1]) for o in a if o[0] == "b") < 30    # aborted mid-decode
    assert sum(hits) > 50 and not all(hits)              # decode steps took it; prefill steps did not
    counters = [_counters(e) for e in (fast, slow)]
    assert counters[0] == counters[1]
    assert float(counters[0]["inferctl_engine_preemptions_total"]) > 0
    assert float(counters[0]['inferctl_engine_generation_tokens_total{model="stories260K"}']) == len(a)


def test_reused_metadata_equals_a_fresh_build_and_the_set_is_rebuilt_on_every_change(bundle, monkeypatch):
    engine = _engine(bundle, True)
    build = AttentionMetadata.build.__func__
    checked = []

    def checking(cls, chunks, block_size, device="cpu", reuse=None):
        meta = build(cls, chunks, block_size, device, reuse)
        fresh = build(cls, chunks, block_size, device)
        for f in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables", "logits_indices"):
            assert torch.equal(getattr(meta, f), getattr(fresh, f)), f
        assert (meta.max_context, meta.num_decodes, meta.all_decode) == (
            fresh.max_context, fresh.num_decodes, fresh.all_decode)
        checked.append(meta is reuse)
        return meta
    monkeypatch.setattr(AttentionMetadata, "build", classmethod(checking))
    advance = runner_mod.ModelRunner._advance
    advanced = []

    def checking_advance(self, scheduled, adv):
        sum_ctx = advance(self, scheduled, adv)
        if sum_ctx:   # the in-place advance: the same numbers as a fresh build of this step
            meta = adv[0]
            chunks = [(s.block_table, s.num_computed_tokens, 1, False) for s, _ in scheduled]
            fresh = build(AttentionMetadata, chunks, self.block_size)
            for f in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables", "logits_indices"):
                assert torch.equal(getattr(meta, f), getattr(fresh, f)), f
            assert (meta.max_context, meta.num_decodes, meta.all_decode) == (
                fresh.max_context, fresh.num_decodes, fresh.all_decode)
            assert meta._host[1] == fresh._host[1] and sum_ctx == sum(fresh._host[1])
            ids_t, pos_t = self._input_buffers[len(scheduled)][:2]
            assert ids_t.tolist() == [s.token_ids[-1] for s, _ in scheduled]
            assert pos_t.tolist() == [s.num_computed_tokens for s, _ in scheduled]
            advanced.append(len(scheduled))
        return sum_ctx
    monkeypatch.setattr(runner_mod.ModelRunner, "_advance", checking_advance)
    made = []
    of = runner_mod._DecodeBatch.of.__func__
    monkeypatch.setattr(runner_mod._DecodeBatch, "of",
                        classmethod(lambda cls, seqs: (made.append([s.request_id for s in seqs]), of(cls, seqs))[1]))
    trace: list = []
    _script(engine, trace)
    if engine.model.kernel_ops is not None:
        assert sum(checked) > 0 and len(advanced) > 50     # the in-place rewrite and advance ran, and matched
        assert any(b >= 4 for b in advanced) and any(b == 1 for b in advanced)
    else:   # INFERCTL_CPU_KERNELS=0: the plain attention derives its fields, so no step reuses
        assert not any(checked) and len(checked) > 50
    # a kept set is made only for a set that differs from the one before it (a finish, an abort, a
    # preemption or an arrival changed it), never twice in a row for the same set
    assert all(x != y for x, y in zip(made, made[1:]))
    assert len(made) >= 6
    for rid in ("a", "b", "c", "d", "e", "f"):
        assert any(rid in m for m in made)
    assert any(len(m) >= 4 for m in made) and any(len(m) == 1 for m in made)


@pytest.mark.parametrize("precision", ["int8"])
def test_int8_greedy_is_the_same_with_and_without_it(bundle, precision):
    outs = []
    for fast in (True, False):
        engine = _engine(bundle, fast)
        engine.request_precision(precision)
        engine.step()
        trace: list = []
        outs.append(_script(engine, trace))
        engine.request_precision("full")
        engine.step()
    assert outs[0] == outs[1]


@pytest.mark.parametrize("event", ["finish", "abort", "preempt", "arrival"])
def test_each_change_of_the_running_set_replaces_the_kept_batch(bundle, event):
    engine = _engine(bundle, True)      # 8 blocks of 16: a and b (76 tokens, 5 blocks each) cannot both finish
    n_b = 10 if event == "finish" else 60
    engine.add_request("a", list(range(3, 19)), SamplingParams(max_tokens=60, **G))
    engine.add_request("b", list(range(5, 21)), SamplingParams(max_tokens=n_b, **G))
    for _ in range(4):
        engine.step()
    kept = engine.runner._decode
    assert [s.request_id for s in kept.seqs] == ["a", "b"]
    if event == "finish":
        while "b" in engine._seqs:
            engine.step()
    elif event == "abort":
        engine.abort_request("b")
    elif event == "arrival":
        engine.add_request("c", list(range(7, 23)), SamplingParams(max_tokens=20, **G))
        engine.step()                                      # c's prefill: the general path
    else:
        while engine.scheduler.preemptions_total == 0:
            engine.step()
    while not all(s.output_token_ids and s.num_computed_tokens + 1 == s.num_tokens for s in engine.scheduler.running):
        engine.step()                                      # until the next decode-only step is due
    running = [s.request_id for s in engine.scheduler.running]
    engine.step()
    now = engine.runner._decode
    assert now is not kept and [s.request_id for s in now.seqs] == running != ["a", "b"]
