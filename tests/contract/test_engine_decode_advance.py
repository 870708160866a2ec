"""The decode step's in-place advance (issue 12, wave 11; ``ModelRunner._advance``) on the real
stories260K engine: the script of test_engine_decode_fast_path (arrivals, finishes by max_tokens and
a stop string, an abort, preemption by recompute, a seeded sampled request, logprobs, block
boundaries) gives the same outputs, metrics and reservations with the advance as without it; the
advance is declined at a block boundary and for a step run again without a commit."""

from __future__ import annotations

import torch

from inferctl.engine import runner as runner_mod
from inferctl.engine.attention import AttentionMetadata
from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.sampling_params import SamplingParams

from test_engine_decode_fast_path import _counters, _engine, _script


def test_the_advance_changes_no_output_metric_or_reservation(bundle, monkeypatch):
    with_adv = _engine(bundle, True)
    without = _engine(bundle, True)
    without.runner._advance = lambda scheduled, adv: 0
    orig = runner_mod.ModelRunner._advance
    calls = []   # (applied, at a block boundary) of each call on with_adv

    def counted(self, scheduled, adv):
        r = orig(self, scheduled, adv)
        calls.append((r > 0, any(s.num_computed_tokens % self.block_size == 0 for s, _ in scheduled)))
        return r
    monkeypatch.setattr(runner_mod.ModelRunner, "_advance", counted)
    a = _script(with_adv, [])
    b = _script(without, [])
    assert a == b
    assert with_adv._acts == without._acts
    assert _counters(with_adv) == _counters(without)
    assert {o[4] for o in a} >= {"length", "stop"}
    assert with_adv.scheduler.preemptions_total == without.scheduler.preemptions_total > 0
    if with_adv.model.kernel_ops is not None:
        assert sum(applied for applied, _ in calls) > 50
        assert not any(applied and boundary for applied, boundary in calls)   # declined at a boundary
        assert any(boundary and not applied for applied, boundary in calls)


def test_a_step_run_again_without_a_commit_is_built_not_advanced(bundle):
    engine = LLMEngine(bundle, EngineConfig(num_kv_blocks=8, max_num_seqs=2))
    engine.add_request("a", list(range(3, 19)), SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    engine.add_request("b", list(range(5, 12)), SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    for _ in range(4):   # prefills, then decodes: the advance state is set
        engine.step()
    runner = engine.runner
    seqs = list(engine.scheduler.running)
    # the first of two identical steps (no commit between them) may advance; the second must not
    sched = [(s, 1) for s in seqs]
    applied = []
    orig = runner._advance
    runner._advance = lambda scheduled, adv: (applied.append(orig(scheduled, adv)), applied[-1])[1]
    first = runner.execute(sched)
    again = runner.execute(sched)
    if engine.model.kernel_ops is not None:   # else the plain attention derives its fields: never advanced
        assert applied[0] > 0 and applied[1:] == [0]     # advanced, then declined (the counts did not move)
    else:
        assert not any(applied)
    chunks = [(s.block_table, s.num_computed_tokens, 1, False) for s in seqs]
    fresh = AttentionMetadata.build(chunks, runner.block_size)
    for f in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables", "logits_indices"):
        assert torch.equal(getattr(runner._meta, f), getattr(fresh, f)), f
    assert runner._meta.max_context == fresh.max_context
    assert first.sample.token_ids == again.sample.token_ids
    assert first.activation_bytes == again.activation_bytes
    ids_t, pos_t = runner._input_buffers[len(seqs)][:2]
    assert pos_t.tolist() == [s.num_computed_tokens for s in seqs]
    assert ids_t.tolist() == [s.token_ids[-1] for s in seqs]
