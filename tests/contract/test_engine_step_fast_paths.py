"""The per-step shortcuts of wave 7 (issue 12, docs/performance.md) on the real stories260K engine:
an empty mailbox costs no lock, and the stop checks skipped for a token that cannot stop anything
still stop exactly where engine.stop says (stop ids, end ids, max_tokens, the repetition stop)."""

from __future__ import annotations

import threading

from tests.core_helpers import drain
from tests.obs_helpers import lock_held_elsewhere
from inferctl.engine.commands import CommandMailbox, SetDraining
from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.sampling_params import SamplingParams
from inferctl.engine.stop import RepetitionStop, limit_stop_reason, token_stop_reason


def test_mailbox_truth_is_its_queue():
    box = CommandMailbox()
    assert not box
    box.post(SetDraining(draining=True))
    assert box and len(box) == 1
    box.take_all()
    assert not box


def test_an_empty_mailbox_takes_no_lock_and_a_posted_command_still_applies(bundle):
    engine = LLMEngine(bundle, EngineConfig())
    with lock_held_elsewhere(engine.step_lock):
        done = threading.Event()
        caller = threading.Thread(target=lambda: (engine.apply_commands(), done.set()))
        caller.start()
        assert done.wait(5), "apply_commands waited for the step lock with nothing queued"
    caller.join()
    # a command posted while another thread steps waits for that thread's next step, then applies
    engine.attach_stepping_thread(threading.Thread())
    engine.set_draining(True)
    assert not engine.draining
    engine.attach_stepping_thread(None)
    engine.step()
    assert engine.draining


def _reference_finish(tokens: list[int], params: SamplingParams, end_ids, rule: RepetitionStop) -> tuple[int, str]:
    """Where engine.stop's functions, asked after every token, end ``tokens``: (length, reason)."""
    for n in range(1, len(tokens) + 1):
        reason = token_stop_reason(tokens[n - 1], nonfinite=False, end_ids=end_ids, ignore_eos=params.ignore_eos,
                                   stop_token_ids=frozenset(params.stop_token_ids))
        reason = reason or limit_stop_reason(tokens[:n], max_tokens=params.max_tokens,
                                             repetition_stop=bool(params.repetition_stop), rule=rule)
        if reason:
            return n, reason
    return len(tokens), "unfinished"


def test_skipped_stop_checks_stop_exactly_where_the_stop_functions_do(bundle):
    engine = LLMEngine(bundle, EngineConfig(repetition_stop_max_ngram=16))
    ids = bundle.tokenizer.encode("Once upon a time")
    engine.add_request("free", ids, SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))
    free = drain(engine)[0]["free"]
    rule, end_ids = engine._repetition_stop, engine._end_ids
    stop_tok = free[7]
    cases = {
        "stop_id": SamplingParams(max_tokens=200, temperature=0, ignore_eos=True, stop_token_ids=[stop_tok]),
        "length": SamplingParams(max_tokens=13, temperature=0, ignore_eos=True),
        "length1": SamplingParams(max_tokens=1, temperature=0, ignore_eos=True),
        "eos": SamplingParams(max_tokens=200, temperature=0),
        "repetition": SamplingParams(max_tokens=200, temperature=0, ignore_eos=True, repetition_stop=True),
    }
    for rid, params in cases.items():
        engine.add_request(rid, ids, params)
    tokens, final = drain(engine)
    for rid, params in cases.items():
        n, reason = _reference_finish(free, params, end_ids, rule)
        assert (len(tokens[rid]), final[rid].finish_reason) == (n, reason), rid
        assert tokens[rid] == free[:n]
    assert final["stop_id"].finish_reason == "stop" and tokens["stop_id"][-1] == stop_tok
    assert len(tokens["length"]) == 13 and len(tokens["length1"]) == 1
