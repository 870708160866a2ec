"""Check 2, the engine on CUDA: greedy output against the CPU reference, and speed beside
Hugging Face transformers on the same device in the same run.

* Reference: stories260K, prompt "Once upon a time", 60 greedy tokens. On CPU (float32) the
  text must start with llama2.c's documented continuation (models/stories260K/README.md). On
  CUDA the token ids must equal the CPU run's up to the first near-tie of the CPU run: the
  first position whose top-2 log-probability margin (= the top-2 logit margin, log-softmax
  subtracts one constant per row) is below ``NEAR_TIE`` (0.01). Checked in float32 (pass/fail) and
  reported in bfloat16 (the engine's default CUDA dtype; informative, its rounding error is larger
  than 0.01).
* Speed: useful output tokens/s at batch 1 and at ``concurrency`` requests added at once (all
  prompts ``prompt_len`` tokens, ``output_len`` greedy tokens, EOS ignored), the engine
  (continuous batching, paged KV) and transformers ``generate`` (one static batch, no padding
  since every prompt has the same length), same device and dtype, after one warm-up each. Ratio
  = engine / transformers.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

PROMPT = "Once upon a time"
#: llama2.c's documented greedy continuation of PROMPT (models/stories260K/README.md).
REFERENCE = (", there was a little girl named Lily. She loved to play outside in the park. One day, "
             "she saw a big, red ball. She wanted to play with it, but it was too high.")
NEAR_TIE = 0.01
REFERENCE_TOKENS = 60

#: SmolLM2-135M's shape (../shared/models/smollm2-135m-instruct/README.md, from the GGUF
#: metadata): 30 blocks, hidden 576, FFN 1536, 9 heads, 3 KV heads (head dim 64), RoPE base
#: 100000, RMSNorm eps 1e-5, context 8192, vocabulary 49,152, tied embeddings.
SMOLLM2_SHAPE = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                     intermediate_size=1536, vocab_size=49152, max_position_embeddings=8192,
                     rope_theta=100000.0)
#: A 2-layer toy of the same kind for the CPU half under --quick.
TINY_SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=1000)


@contextmanager
def cuda_fraction_restored() -> Iterator[None]:
    """The engine's memory accountant sets ``torch.cuda.set_per_process_memory_fraction`` for
    its budget; this process runs several engines, so the fraction is put back to 1.0 after."""
    import torch

    try:
        yield
    finally:
        if torch.cuda.is_available():
            torch.cuda.set_per_process_memory_fraction(1.0)
            gc.collect()
            torch.cuda.empty_cache()


def greedy_run(bundle, device: str, n: int = REFERENCE_TOKENS, prompt: str = PROMPT) -> dict:
    """Greedy ``n`` tokens of ``prompt`` through the engine; token ids, text and, per token, the
    top-2 log-probability margin."""
    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.sampling_params import SamplingParams

    with cuda_fraction_restored():
        eng = LLMEngine(bundle, EngineConfig(device=device, num_kv_blocks=64, max_num_seqs=4))
        eng.add_request("ref", bundle.tokenizer.encode(prompt),
                        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=2))
        ids: list[int] = []
        margins: list[float] = []
        text = ""
        while eng.has_unfinished_requests():
            for o in eng.step():
                ids += list(o.new_token_ids)
                text += o.new_text
                for top in (o.top_logprobs or []):
                    lps = sorted((float(v) for v in top.values()), reverse=True)
                    margins.append(lps[0] - lps[1] if len(lps) > 1 else float("inf"))
        del eng
    return {"ids": ids, "text": text, "margins": margins}


def first_near_tie(margins: list[float], threshold: float = NEAR_TIE) -> int | None:
    """Index of the first generated token whose top-2 margin is below ``threshold``, or None."""
    return next((i for i, m in enumerate(margins) if m < threshold), None)


def compare(ref: dict, got: dict) -> dict:
    """Where ``got`` first differs from ``ref`` and whether that is at or after ref's first near-tie."""
    n = min(len(ref["ids"]), len(got["ids"]))
    diff = next((i for i in range(n) if ref["ids"][i] != got["ids"][i]), None)
    tie = first_near_tie(ref["margins"])
    limit = tie if tie is not None else n
    return {"first_difference": diff, "first_near_tie_in_reference": tie, "compared_tokens": n,
            "equal_up_to_near_tie": diff is None or diff >= limit,
            "min_margin_before_difference": min(ref["margins"][:diff or n], default=None)}


def cpu_reference(stories_bin: Path) -> tuple[dict, list[str]]:
    """The CPU float32 reference run and the problems found (text not the documented one)."""
    from inferctl.engine.loader import load_llama2c

    bundle = load_llama2c(stories_bin)
    ref = greedy_run(bundle, "cpu")
    problems = [] if ref["text"].startswith(REFERENCE) else [
        f"CPU greedy text is not llama2.c's reference: {ref['text'][:120]!r}"]
    return ref, problems


def cuda_against_reference(stories_bin: Path, ref: dict) -> tuple[dict, list[str]]:
    """stories260K on CUDA in float32 (checked) and bfloat16 (reported) against the CPU run."""
    import torch

    from inferctl.engine.loader import load_llama2c

    out: dict = {}
    problems: list[str] = []
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        bundle = load_llama2c(stories_bin, device="cuda", dtype=dtype)
        got = greedy_run(bundle, "cuda")
        cmp = compare(ref, got)
        out[name] = {**cmp, "text": got["text"][:200]}
        if name == "float32" and not cmp["equal_up_to_near_tie"]:
            problems.append(f"CUDA float32 greedy differs from CPU at token {cmp['first_difference']} "
                            f"before the first near-tie ({cmp['first_near_tie_in_reference']})")
        del bundle
    return out, problems


# ------------------------------------------------------------------------------ speed
def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def engine_tok_s(model_dir: Path, device: str, dtype, n: int, prompt_len: int, output_len: int,
                 threads: int | None) -> dict:
    """The engine's useful output tokens/s for ``n`` requests added at once (one warm-up first)."""
    from bench.common import fixed_workload
    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.loader import load_model
    from inferctl.engine.sampling_params import SamplingParams

    with cuda_fraction_restored():
        bundle = load_model(str(model_dir), device=device, dtype=dtype)
        blocks = n * (-(-(prompt_len + output_len) // 16)) + 8
        eng = LLMEngine(bundle, EngineConfig(device=device, max_num_seqs=max(n, 1), num_kv_blocks=blocks,
                                             num_threads=threads, max_model_len=prompt_len + output_len + 8))
        reqs = fixed_workload(n, prompt_len, output_len, bundle.args.vocab_size)

        def go(tag: str, rs) -> float:
            _sync(device)
            t0 = time.perf_counter()
            for i, r in enumerate(rs):
                eng.add_request(f"{tag}{i}", list(r.prompt),
                                SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True))
            done = 0
            while eng.has_unfinished_requests():
                done += sum(len(o.new_token_ids) for o in eng.step())
            _sync(device)
            if done != sum(r.max_tokens for r in rs):
                raise RuntimeError(f"engine produced {done} tokens, expected {sum(r.max_tokens for r in rs)}")
            return time.perf_counter() - t0

        go("warm", reqs[:min(n, 2)])
        secs = go("r", reqs)
    return {"tok_s": n * output_len / secs, "seconds": secs}


def hf_tok_s(model_dir: Path, device: str, dtype, n: int, prompt_len: int, output_len: int,
             threads: int | None) -> dict:
    """transformers ``generate``: one static batch of ``n`` equal-length prompts, greedy, EOS off."""
    import torch
    from transformers import LlamaForCausalLM

    from bench.common import fixed_workload

    if threads:
        torch.set_num_threads(threads)
    model = LlamaForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
    reqs = fixed_workload(n, prompt_len, output_len, model.config.vocab_size)
    ids = torch.tensor([list(r.prompt) for r in reqs], device=device)

    def go(x) -> float:
        _sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=output_len,
                                 min_new_tokens=output_len, do_sample=False, eos_token_id=None, pad_token_id=0)
        _sync(device)
        if out.shape[1] != x.shape[1] + output_len:
            raise RuntimeError(f"transformers returned {out.shape[1] - x.shape[1]} tokens, expected {output_len}")
        return time.perf_counter() - t0

    go(ids[:min(n, 2)])
    secs = go(ids)
    model.to("cpu")   # hand its device memory back before the next model
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"tok_s": n * output_len / secs, "seconds": secs}


def speed_table(models: dict[str, Path], device: str, dtype, batches: tuple[int, ...], prompt_len: int,
                output_len: int, threads: int | None) -> dict:
    """``{model: {batch: {engine_tok_s, hf_tok_s, ratio}}}`` (ratio = engine / transformers)."""
    out: dict = {}
    for name, path in models.items():
        rows = {}
        for b in batches:
            e = engine_tok_s(path, device, dtype, b, prompt_len, output_len, threads)
            h = hf_tok_s(path, device, dtype, b, prompt_len, output_len, threads)
            rows[str(b)] = {"engine_tok_s": round(e["tok_s"], 1), "hf_tok_s": round(h["tok_s"], 1),
                            "ratio": round(e["tok_s"] / h["tok_s"], 3) if h["tok_s"] > 0 else None}
        out[name] = rows
    return out


def bench_models(cache: Path, stories_bin: Path, big: bool) -> dict[str, Path]:
    """stories260K as a HF directory and a random-weight Llama of SmolLM2-135M's shape (``big``)
    or of the 2-layer toy shape, made here with transformers (bench.models)."""
    from bench.models import synthetic_hf_dir
    from inferctl.engine.loader import load_llama2c, save_hf_dir

    stories_dir = cache / "stories260K-hf"
    if not (stories_dir / "model.safetensors").exists():
        save_hf_dir(load_llama2c(stories_bin), stories_dir)
    shape = SMOLLM2_SHAPE if big else TINY_SHAPE
    name = "smollm2-135m-shape-random" if big else "tiny-llama-random"
    return {"stories260K": stories_dir, name: synthetic_hf_dir(seed=0, cache=cache, **shape)}
