"""llama2.c checkpoints end a story with BOS (id 1): generation stops there, as llama2.c's run.c does."""

from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.loader import load_model
from inferctl.engine.sampling_params import SamplingParams


def _run(engine, ids, **params):
    engine.add_request("r", ids, SamplingParams(**params))
    tokens, reason = [], None
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.extend(out.new_token_ids)
            if out.finished:
                reason = out.finish_reason
    return tokens, reason


def test_story_ends_at_bos_unless_ignore_eos(stories_dir):
    bundle = load_model(str(stories_dir / "stories260K.bin"))
    assert bundle.stop_token_ids == (bundle.tokenizer.bos_id,) == (1,)
    engine = LLMEngine(bundle, EngineConfig())
    prompt = bundle.tokenizer.encode("Once upon a time", bos=True)

    tokens, reason = _run(engine, prompt, max_tokens=400, temperature=0)
    assert reason == "stop"
    assert tokens[-1] == 1 and 1 not in tokens[:-1]
    assert len(tokens) < 400

    more, reason = _run(engine, prompt, max_tokens=400, temperature=0, ignore_eos=True)
    assert reason == "length" and len(more) == 400
    assert more[: len(tokens)] == tokens          # same greedy path up to the story's end


def test_idle_engine_releases_its_activation_cache(stories_dir):
    """After the last request finishes, cached activation segments go back (empty_cache): an idle
    engine shows reserved == allocated, so the controller sees its real free memory."""
    bundle = load_model(str(stories_dir / "stories260K.bin"))
    engine = LLMEngine(bundle, EngineConfig(memory_budget_bytes=16 * 2**20, max_num_batched_tokens=128))
    prompt = bundle.tokenizer.encode("Once upon a time there was a dog who liked to run", bos=True)
    engine.add_request("busy", prompt, SamplingParams(max_tokens=8, temperature=0))
    engine.step()                                  # prefill: activations reserved, then cached
    mem = engine.stats()["memory"]
    assert mem["reserved_bytes"] > mem["allocated_bytes"]   # the cache is kept while busy
    while engine.has_unfinished_requests():
        engine.step()
    mem = engine.stats()["memory"]
    assert mem["reserved_bytes"] == mem["allocated_bytes"]
    assert mem["free_bytes"] == mem["budget_bytes"] - mem["reserved_bytes"]
