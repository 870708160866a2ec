"""The engine beside llama.cpp on the same weights, in one run, sides alternating, best of 3.

    python -m bench.peer                      # the full measurement (minutes; a quiet machine)
    python -m bench.peer --quick              # smoke test: tiny model, short outputs, no doc write

llama.cpp is llama-cpp-python built from its source distribution in a venv of its own (its
``python`` is ``--peer-python``, default ``$INFERCTL_PEER_PYTHON`` or ``/work/peer-venv/bin/python``)::

    python3 -m venv /work/peer-venv && /work/peer-venv/bin/pip install numpy
    CMAKE_ARGS="-DGGML_NATIVE=ON" /work/peer-venv/bin/pip install --no-binary llama-cpp-python \\
        llama-cpp-python==0.3.36

It runs as a subprocess of this command (this file, ``--worker``: only the standard library,
numpy and ``llama_cpp`` are imported there) through llama.cpp's own C API (``llama_decode``
over a ``llama_batch``), so no Python sampler or server sits on its side. Its attention runs in fp32 (K/V
cache f32, flash attention off) like the engine's, not in llama.cpp's default f16 (``PEER_ATTENTION``,
``--peer-attention default`` for llama.cpp's own defaults).

Weights: each Hugging Face model of ``bench.models`` is loaded by the engine and written to
GGUF with the ``gguf`` package (``GGUFWriter``, architecture ``llama``): ``f32``, and ``Q8_0``
(``gguf.quants.quantize``; a matrix whose inner size is not a multiple of 32, Q8_0's block,
stays f32, as ``convert_hf_to_gguf.py`` does). q/k rows in Hugging Face's rotate-half order are
permuted back to the interleaved order llama.cpp rotates (``convert_hf_to_gguf.py``'s
``LlamaModel.permute``). The tokenizer written is a placeholder vocabulary of the model's size
(ids are what both sides are fed; no text is read). The SmolLM2 GGUF file is used as it is.

Per model, in one run, ``--repeats`` rounds, the order of the sides flipped every round:

* copy bandwidth (``bench.decode.bandwidth``) at the start and the end of the run, best kept;
* batch-1 decode: 16 prompt ids, ``--output`` greedy tokens, EOS ignored; tok/s over the decode
  tokens after the first (the prefill excluded). Engine ``full`` ↔ llama.cpp ``f32``, engine
  ``int8`` ↔ llama.cpp ``Q8_0``, the SmolLM2 Q4_1 file ↔ the engine in ``full`` (dequantized) and ``int4``
  (the file's 4-bit codes, engine/quant_int4.py);
* the 32 mixed requests of ``bench.common.make_workload`` all at t = 0: useful output tok/s.
  llama.cpp: one context, 32 sequences, split KV (``kv_unified`` off, 512 cells each), each
  ``llama_decode`` carrying every running sequence's next token plus prompt chunks up to
  ``n_batch`` (512), as llama.cpp's server schedules;
* greedy check: the batch-1 decode tokens of engine full and llama.cpp f32 (same weights) are
  compared, and the first min(64, max_tokens) tokens of 4 mixed requests; a divergence where the engine's
  top-2 logits (transformers, fp32) are within ``TIE_LOGIT_GAP`` is a near-tie, reported, not a
  mismatch; Q8_0 vs int8 (different quantizers) are reported, not required, equal.

Writes the section ``peer`` of docs/benchmarks.md (with the command and the load average at
the start and the end) unless ``--quick`` or ``--no-write``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEER_PYTHON = os.environ.get("INFERCTL_PEER_PYTHON", "/work/peer-venv/bin/python")
SMOLLM2 = "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = list(range(3, 19))
N_CTX_PER_SEQ = 512
N_BATCH = 512
#: ggml.h ``GGML_TYPE_F32`` and llama.h ``LLAMA_FLASH_ATTN_TYPE_DISABLED`` (``llama_context_params`` values).
GGML_TYPE_F32, LLAMA_FLASH_ATTN_TYPE_DISABLED = 0, 0
#: How llama.cpp computes attention: "fp32" (the default here) = K/V cache f32 and flash attention off, the
#: engine's numerics (``--kv-cache-dtype auto`` = the model's fp32; fp32 attention); "default" = llama.cpp's own
#: defaults, K/V cache f16 and flash attention "auto" (on for CPU), whose graph casts K and V to f16 even from an
#: f32 cache (llama-graph.cpp ``build_attn_mha``) and masks in f16. On stories260K the defaults move logits by up
#: to 4e-2 against llama2.c's run.c (fp32 settings: 6.5e-5), enough to flip a greedy token whose top-2 gap is
#: 6.6e-3 (token 100 of the 128 batch-1 decode tokens).
PEER_ATTENTION = "fp32"


# ---- the llama.cpp side (runs in the peer venv: stdlib, numpy, llama_cpp only) -------------------
def _worker(job: dict) -> dict:
    import ctypes

    import llama_cpp as L
    import numpy as np

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(job["gguf"].encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {job['gguf']}")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    n_seq = max(1, len(job["requests"]))
    cp = L.llama_context_default_params()
    cp.n_ctx = N_CTX_PER_SEQ * n_seq
    cp.n_batch = N_BATCH
    cp.n_ubatch = N_BATCH
    cp.n_seq_max = n_seq
    cp.n_threads = cp.n_threads_batch = job["threads"]
    if job.get("attention", PEER_ATTENTION) == "fp32":
        cp.type_k = cp.type_v = GGML_TYPE_F32
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED
    if hasattr(cp, "kv_unified"):
        cp.kv_unified = False
    if hasattr(cp, "no_perf"):
        cp.no_perf = True
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")
    batch = L.llama_batch_init(N_BATCH, 0, n_seq)

    def clear() -> None:
        if hasattr(L, "llama_memory_clear"):
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
        else:
            L.llama_kv_self_clear(ctx)

    def decode(items: list[tuple[int, int, int, bool]]) -> list[int]:
        """items: (token, pos, seq, want_logits) → argmax of each wanted row, in order."""
        batch.n_tokens = len(items)
        for i, (tok, pos, seq, want) in enumerate(items):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if want else 0
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        out = []
        for i, (_, _, _, want) in enumerate(items):
            if want:
                ptr = L.llama_get_logits_ith(ctx, i)
                arr = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
                out.append(int(arr.argmax()))
        return out

    def mixed(requests: list[dict]) -> tuple[float, list[list[int]]]:
        clear()
        t0 = time.perf_counter()
        pos = [0] * len(requests)           # tokens in the cache per sequence
        outs: list[list[int]] = [[] for _ in requests]
        pending: list[int | None] = [None] * len(requests)
        active = list(range(len(requests)))
        while active:
            items: list[tuple[int, int, int, bool]] = []
            who: list[int] = []              # the sequence of each wanted logits row, in order
            for s in active:                 # every running sequence's next token first
                if pending[s] is not None:
                    items.append((pending[s], pos[s], s, True))
                    who.append(s)
                    pos[s] += 1
            for s in active:                 # then prompt chunks up to the batch size
                prompt = requests[s]["prompt"]
                if pending[s] is None and pos[s] < len(prompt) and len(items) < N_BATCH:
                    take = min(len(prompt) - pos[s], N_BATCH - len(items))
                    items += [(prompt[p], p, s, p == len(prompt) - 1) for p in range(pos[s], pos[s] + take)]
                    pos[s] += take
                    if pos[s] == len(prompt):
                        who.append(s)
            for s, tok in zip(who, decode(items)):
                outs[s].append(tok)
                pending[s] = tok
            active = [s for s in active if len(outs[s]) < requests[s]["max_tokens"]]
        return time.perf_counter() - t0, outs

    result: dict = {"n_vocab": n_vocab, "llama_cpp": getattr(L, "__version__", "?")}
    if job["mode"] == "decode":
        clear()
        prompt = job["requests"][0]["prompt"]
        n = job["requests"][0]["max_tokens"]
        toks = decode([(t, i, 0, i == len(prompt) - 1) for i, t in enumerate(prompt)])
        times = [time.perf_counter()]
        p = len(prompt)
        while len(toks) < n:
            toks += decode([(toks[-1], p, 0, True)])
            p += 1
            times.append(time.perf_counter())
        result.update(tok_s=(len(times) - 1) / (times[-1] - times[0]), tokens=toks)
    else:
        mixed([{"prompt": job["requests"][0]["prompt"][:8], "max_tokens": 2}])   # warm-up
        secs, outs = mixed(job["requests"])
        result.update(seconds=secs, tok_s=sum(len(o) for o in outs) / secs, tokens=outs)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return result


def run_peer(peer_python: str, gguf: Path, mode: str, requests: list[dict], threads: int,
             attention: str = PEER_ATTENTION) -> dict:
    """One llama.cpp measurement in the peer venv (a subprocess); ``attention`` "fp32" | "default" (see
    ``PEER_ATTENTION``); raises RuntimeError on failure."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        out = Path(tmp) / "out.json"
        job.write_text(json.dumps({"gguf": str(gguf), "mode": mode, "requests": requests, "threads": threads,
                                   "attention": attention}))
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        proc = subprocess.run([peer_python, str(Path(__file__).resolve()), "--worker", str(job), str(out)],
                              capture_output=True, text=True, env=env, timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"llama.cpp worker failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return json.loads(out.read_text())


# ---- GGUF conversion (this side: torch, gguf) ------------------------------------------------------
def _permute_half_to_interleaved(w, n_heads: int):
    """Rows of q/k from rotate-half to interleaved pairs (convert_hf_to_gguf.py ``permute``)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model_dir: Path, out: Path, qtype: str) -> Path:
    """The engine's weights of ``model_dir`` as a llama GGUF (``qtype`` "f32" or "q8_0")."""
    import gguf
    import numpy as np

    from inferctl.engine.loader import load_model

    bundle = load_model(str(model_dir))
    a = bundle.args
    w = {k: v.float().numpy() for k, v in bundle.model.export_weights().items()}
    wr = gguf.GGUFWriter(str(out), "llama")
    wr.add_name(model_dir.name)
    wr.add_context_length(a.max_seq_len)
    wr.add_embedding_length(a.dim)
    wr.add_block_count(a.n_layers)
    wr.add_feed_forward_length(a.hidden_dim)
    wr.add_head_count(a.n_heads)
    wr.add_head_count_kv(a.n_kv_heads)
    wr.add_rope_dimension_count(a.head_dim)
    wr.add_rope_freq_base(a.rope_theta)
    wr.add_layer_norm_rms_eps(a.norm_eps)
    wr.add_vocab_size(a.vocab_size)
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == "q8_0" else gguf.LlamaFileType.ALL_F32)
    toks = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    toks += [f"\u2581w{i}".encode() for i in range(max(0, a.vocab_size - len(toks)))]
    toks = toks[: a.vocab_size]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE if t.startswith(b"<0x") else gguf.TokenType.NORMAL for t in toks[3:]]
    wr.add_tokenizer_model("llama")
    wr.add_token_list(toks)
    wr.add_token_scores([0.0] * len(toks))
    wr.add_token_types(types)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)

    def put(name: str, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if qtype == "q8_0" and arr.ndim == 2 and arr.shape[1] % 32 == 0:
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            wr.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            wr.add_tensor(name, arr)

    half = a.rope_style == "half"
    put("token_embd.weight", w["tok_embeddings.weight"])
    put("output_norm.weight", w["norm.weight"])
    if not a.tie_embeddings:
        put("output.weight", w["output.weight"])
    for i in range(a.n_layers):
        p = f"layers.{i}."
        wq, wk = w[p + "attention.wq.weight"], w[p + "attention.wk.weight"]
        if half:
            wq, wk = _permute_half_to_interleaved(wq, a.n_heads), _permute_half_to_interleaved(wk, a.n_kv_heads)
        for gname, arr in (("attn_norm", w[p + "attention_norm.weight"]), ("attn_q", wq), ("attn_k", wk),
                           ("attn_v", w[p + "attention.wv.weight"]), ("attn_output", w[p + "attention.wo.weight"]),
                           ("ffn_norm", w[p + "ffn_norm.weight"]), ("ffn_gate", w[p + "feed_forward.w1.weight"]),
                           ("ffn_up", w[p + "feed_forward.w3.weight"]), ("ffn_down", w[p + "feed_forward.w2.weight"])):
            put(f"blk.{i}.{gname}.weight", arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return out


# ---- the engine side -------------------------------------------------------------------------------
def engine_decode(model: Path, precision: str, output: int, threads: int) -> dict:
    """Batch-1 greedy decode on the engine: ``{"tok_s", "tokens"}`` (first token excluded from the rate)."""
    from inferctl.engine.sampling_params import SamplingParams

    from bench.runners import load_engine

    eng = load_engine(model, threads, precision, max_num_seqs=1)
    eng.add_request("warm", PROMPT[:4], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    eng.add_request("r", list(PROMPT), SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True))
    times, toks = [], []
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.new_token_ids:
                times.append(time.perf_counter())
                toks += list(o.new_token_ids)
    return {"tok_s": (len(times) - 1) / (times[-1] - times[0]), "tokens": toks}


def engine_mixed(model: Path, precision: str, requests, threads: int) -> dict:
    from bench.runners import run_engine

    r = run_engine(model, requests, threads, precision)
    return {"tok_s": r.tok_s, "seconds": r.seconds}


def engine_tokens(model: Path, precision: str, requests, n: int, threads: int) -> list[list[int]]:
    """Greedy tokens of ``requests`` (first ``n`` of each) on the engine, all in one batch."""
    from inferctl.engine.sampling_params import SamplingParams

    from bench.runners import load_engine

    eng = load_engine(model, threads, precision, max_num_seqs=len(requests))
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(len(requests))}
    for i, r in enumerate(requests):
        eng.add_request(f"r{i}", list(r.prompt), SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    while eng.has_unfinished_requests():
        for o in eng.step():
            out[o.request_id] += list(o.new_token_ids)
    return [out[f"r{i}"] for i in range(len(requests))]


#: A first divergence where the engine's top-2 logits are closer than this is a near-tie: fp32 sums in a different
#: order (llama.cpp's kernels vs torch's) may pick either token there, so it is reported, not counted as a mismatch.
TIE_LOGIT_GAP = 1e-3


def _top2_gap(model: Path, ids: list[int]) -> float | None:
    """Gap between the two largest next-token logits after ``ids`` (transformers, fp32), None where it can't load."""
    try:
        import torch
        from transformers import LlamaForCausalLM

        m = LlamaForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
        with torch.inference_mode():
            top = m(torch.tensor([ids])).logits[0, -1].topk(2).values
        return float(top[0] - top[1])
    except Exception:  # noqa: BLE001 - a GGUF file or missing transformers: no tie check
        return None


def _near_tie(model: Path, prompt: list[int], engine_toks: list[int], n: int) -> str | None:
    """``"near-tie (gap G)"`` when the engine's greedy choice at position ``n`` (the first divergence) was one."""
    gap = _top2_gap(model, list(prompt) + list(engine_toks[:n]))
    return f"near-tie at token {n} (top-2 logit gap {gap:.1e})" if gap is not None and gap < TIE_LOGIT_GAP else None


def _fractions(agree: list[int], compared: list[int]) -> str:
    """``"27/27, 60/64"``: tokens agreeing of tokens compared, per request."""
    return ", ".join(f"{n}/{m}" for n, m in zip(agree, compared))


def _agree(a: list[int], b: list[int]) -> int:
    """Length of the common prefix."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ---- the run -----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--models", default="stories260K,synthetic,smollm2",
                    help="comma list of stories260K, synthetic, synthetic-tiny, smollm2")
    ap.add_argument("--output", type=int, default=256, help="batch-1 decode tokens")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peer-python", default=PEER_PYTHON)
    ap.add_argument("--peer-attention", choices=("fp32", "default"), default=PEER_ATTENTION,
                    help="llama.cpp's attention: fp32 (K/V f32, flash attention off: the engine's numerics) or its "
                         "defaults (K/V f16, flash attention auto); see PEER_ATTENTION")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: synthetic-tiny + stories260K, 24 tokens, 4 short requests, 1 round, no doc write")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    if a.worker:
        job = json.loads(Path(a.worker[0]).read_text())
        Path(a.worker[1]).write_text(json.dumps(_worker(job)))
        return 0
    return _run(a)


def _run(a: argparse.Namespace) -> int:
    import torch

    from bench.common import SHARED, fmt, machine_facts, make_workload, md_table, section, write_section
    from bench.decode import bandwidth
    from bench.models import cache_dir, model_dir

    torch.set_num_threads(a.threads)
    if a.quick:
        a.models, a.output, a.requests, a.repeats = "synthetic-tiny,stories260K", 24, 4, 1
    if not Path(a.peer_python).exists():
        print(f"--peer-python {a.peer_python} does not exist: build the peer venv (see python -m bench.peer -h)",
              file=sys.stderr)
        return 2
    facts = machine_facts()
    bws = [bandwidth(256, 5, a.threads)]
    gguf_dir = cache_dir() / "peer-gguf"
    gguf_dir.mkdir(parents=True, exist_ok=True)
    rows, checks, notes = [], [], []
    for name in a.models.split(","):
        if name == "smollm2":
            src = SHARED / "models" / SMOLLM2
            if not src.exists():
                notes.append(f"- smollm2: {src} missing, skipped.")
                continue
            pairs = [("file (Q4_1)", "full", src), ("file (Q4_1)", "int4", src)]  # int4: the Q4_1 codes kept
            vocab = None
            mdir = src
        else:
            mdir = model_dir(name)
            pairs = []
            for prec, q in (("full", "f32"), ("int8", "q8_0")):
                g = gguf_dir / f"{mdir.name}-{q}.gguf"
                if not g.exists():
                    write_gguf(mdir, g, q)
                pairs.append((q.upper(), prec, g))
            vocab = None
        try:
            from inferctl.engine.loader import load_model

            vocab = load_model(str(mdir)).args.vocab_size
        except Exception as exc:  # noqa: BLE001 - a model the engine cannot load is reported, not fatal
            notes.append(f"- {name}: the engine cannot load {mdir}: {exc}")
            continue
        work = make_workload(a.requests, vocab) if not a.quick else make_workload(
            a.requests, vocab, prompt_range=(8, 24), output_range=(8, 24))
        reqs = [{"prompt": list(r.prompt), "max_tokens": r.max_tokens} for r in work]
        dec_req = [{"prompt": PROMPT, "max_tokens": a.output}]
        for qlabel, prec, g in pairs:
            res: dict[str, list[dict]] = {k: [] for k in ("e_dec", "p_dec", "e_mix", "p_mix")}
            for rnd in range(a.repeats):
                order = ("engine", "peer") if rnd % 2 == 0 else ("peer", "engine")
                for side in order:
                    if side == "engine":
                        res["e_dec"].append(engine_decode(mdir, prec, a.output, a.threads))
                        res["e_mix"].append(engine_mixed(mdir, prec, work, a.threads))
                    else:
                        res["p_dec"].append(run_peer(a.peer_python, g, "decode", dec_req, a.threads,
                                                         a.peer_attention))
                        res["p_mix"].append(run_peer(a.peer_python, g, "mixed", reqs, a.threads,
                                                         a.peer_attention))
            best = {k: max(v, key=lambda r: r["tok_s"]) for k, v in res.items()}
            for wl, e, p in (("batch-1 decode", best["e_dec"], best["p_dec"]),
                             (f"{a.requests} mixed requests", best["e_mix"], best["p_mix"])):
                rows.append([name, wl, f"engine {prec} vs llama.cpp {qlabel}", fmt(e["tok_s"]), fmt(p["tok_s"]),
                             f"{e['tok_s'] / p['tok_s']:.2f}×",
                             " / ".join(fmt(r["tok_s"]) for r in res["e_dec" if wl.startswith("batch") else "e_mix"]),
                             " / ".join(fmt(r["tok_s"]) for r in res["p_dec" if wl.startswith("batch") else "p_mix"])])
            agree = _agree(best["e_dec"]["tokens"], best["p_dec"]["tokens"])
            n4 = min(4, len(work))
            e4 = engine_tokens(mdir, prec, work[:n4], 64, a.threads)
            p4 = [t[:64] for t in best["p_mix"]["tokens"][:n4]]     # each request's max_tokens may be < 64
            agree4 = [_agree(x, y) for x, y in zip(e4, p4)]
            cmp4 = [min(len(x), len(y)) for x, y in zip(e4, p4)]
            ties: list[str | None] = []
            if qlabel == "F32" and agree < len(best["e_dec"]["tokens"]):
                ties.append(_near_tie(mdir, PROMPT, best["e_dec"]["tokens"], agree))
            ties += [_near_tie(mdir, r.prompt, x, n) for r, x, y, n in zip(work, e4, p4, agree4)
                     if qlabel == "F32" and n < min(len(x), len(y))]
            ok = all(ties)          # every divergence (if any) at a near-tie
            if ties and ok:
                notes.append(f"- {name} {qlabel}: diverged only at near-ties: {'; '.join(ties)}.")
            verdict = (f" (required equal up to near-ties, top-2 logit gap < {TIE_LOGIT_GAP:g}: "
                       f"{'yes' if ok else 'NO'})"
                       if qlabel == "F32"
                       else " (different quantizers: reported only)")
            checks.append(f"- {name}, engine {prec} vs llama.cpp {qlabel}: greedy tokens agree on "
                          f"{agree}/{len(best['e_dec']['tokens'])} batch-1 decode tokens and "
                          f"{_fractions(agree4, cmp4)} tokens of {n4} mixed requests (the first min(64, max_tokens) "
                          f"of each){verdict}; llama.cpp attention {a.peer_attention}.")
    bws.append(bandwidth(256, 5, a.threads))
    bw = max(bws, key=lambda b: b["copy_gbps"])
    end = machine_facts()
    body = (f"llama.cpp: llama-cpp-python (native build, `{a.peer_python}`); {a.threads} threads both sides; "
            f"best of {a.repeats}, sides alternating; greedy, EOS ignored. Copy bandwidth {bw['copy_gbps']:.1f} GB/s "
            f"(read {bw['read_gbps']:.1f} GB/s), best of the start and the end of the run; load average at the end "
            f"{end['load_1m']} / {end['load_5m']} / {end['load_15m']}.\n\n"
            + md_table(["model", "workload", "pair", "engine tok/s", "llama.cpp tok/s", "engine ÷ llama.cpp",
                        "engine runs", "llama.cpp runs"], rows)
            + "\n\n" + "\n".join(checks + notes))
    print(body)
    if not (a.quick or a.no_write):
        write_section("peer", section("peer", "The engine beside llama.cpp on the same weights", body, facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
