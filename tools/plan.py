"""``inferctl plan``: the capacity planner — memory and GPUs for a model, a precision, a context
and a concurrency (the product notes' §1.1 formula and §5.1 hardware guide).

For a model (a llama2.c ``.bin``, a Hugging Face directory, a GGUF file — only its metadata is
read, with ``gguf.GGUFReader``, nothing is dequantized — or dimensions given as flags):

* **weights** = params × bits / 8 at ``--precision`` (fp32 32, bf16/fp16 16, int8 8, int4 4
  bits). Real quantized formats add scales (GGUF Q4_1 stores 32 weights in 20 bytes, i.e. 5
  bits each), so for a GGUF file the file's own tensor bytes are given too ("as stored");
  ``--precision auto`` uses them.
* **KV cache** = 2 (K and V) × layers × KV heads × head dim × bytes per element, per token;
  × ``--context`` × ``--concurrency`` (every sequence at full context, the worst case). The
  element is the KV cache dtype (``auto``: fp32 for fp32 models, else 2 bytes — weight-only
  int8/int4 leave the KV cache in 16 bits, as vLLM's ``--kv-cache-dtype auto``).
* **activations per step**: three figures (:func:`activation_figures`):
  - the notes' term ``sequence² × heads × hidden × bytes`` as written, for one sequence. It
    pictures *unfused* attention materialising the score matrix, but the score matrix is
    ``heads × sequence²`` per layer — the extra ``× hidden`` over-counts by a factor of
    ``hidden`` (576 for SmolLM2, 8192 for a 70B);
  - the unfused score matrix itself, ``2 × concurrency × heads × context² × bytes`` (scores
    and probabilities of one layer, every sequence prefilling its whole context at once). With
    fused / flash attention (FlashAttention, Dao et al. 2022, arXiv:2205.14135) or paged
    decode kernels (vLLM) it is never materialised, so this over-counts; it also ignores the
    MLP temporaries and the logits (``tokens × vocab × 4`` bytes), where it under-counts;
  - the engine's own estimate (``inferctl.engine.memory_plan.estimate_step_activation_bytes``,
    the eager PyTorch forward of this project's engine): the worst of a ``max_num_batched_tokens``
    prefill chunk at the end of the context and a decode step of every sequence at full
    context. This one goes into the total.
* **total** = weights + KV cache + the engine's activation estimate; the **GPUs** it fits on
  (:mod:`inferctl.tools.gpu_specs`, NVIDIA datasheet figures) keeping ``--gpu-memory-utilization``
  (vLLM's name, default 0.9) of each, how many would be needed when one is not enough (a lower
  bound: tensor parallelism splits weights and KV, not every activation), and the batch-1
  **decode bound** = memory bandwidth ÷ weight bytes tokens/s (every weight is read once per
  token; with the context's KV read too: ÷ (weights + KV of one full-context sequence)).

Errors are :class:`PlanError` naming the flag (``--context: must be an integer >= 1, got -5``).
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from inferctl.engine.llama2c_format import LLAMA2C_MAGIC, expected_bytes
from inferctl.tools.gpu_specs import GPUS
from inferctl.tools.plan_draft import FLAG as SPEC_FLAG, DraftError, as_dict, draft_figures, parse_flag

__all__ = ["PRECISION_BITS", "KV_DTYPE_BYTES", "ModelDims", "Plan", "PlanError", "activation_figures",
           "MAX_CONCURRENCY", "MAX_CONTEXT", "compute_plan", "dims_from_flags", "llama_params", "parse_count",
           "precision_words", "read_model", "register"]

#: Bits per weight of each ``--precision`` (the notes' params × bits / 8).
PRECISION_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "int8": 8, "int4": 4}
#: Bytes per KV cache element of each ``--kv-cache-dtype`` (vLLM's names).
KV_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
#: The engine's default per-step token budget (``EngineConfig.max_num_batched_tokens``).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
#: Largest ``--context`` (tokens): 1,048,576 (2**20), 8× a 128k-context model's; a model whose
#: own context length is longer is planned at this bound, with a note.
MAX_CONTEXT = 1 << 20
#: Largest ``--concurrency`` (sequences at full context at once).
MAX_CONCURRENCY = 100_000
#: Largest model dimension (layers, hidden, heads, vocabulary…) a plan takes: 2**31 - 1, far
#: above any real model (vocabularies ~256k, hidden sizes ~32k), so no product overflows a float.
MAX_DIMENSION = (1 << 31) - 1
#: ``torch_dtype`` values of a Hugging Face config.json the plan knows, and their short names.
HF_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
#: ``ModelDims.dtype`` prefix for a config.json precision the plan does not know (``float64``…)
UNKNOWN_DTYPE = "unknown:"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class PlanError(ValueError):
    """Bad planner input; ``flag`` is the option to fix (``--context``), ``message`` the why."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag
        self.message = message


@dataclass
class ModelDims:
    """What the planner knows of a model. ``params`` = weight elements (tied embeddings once);
    ``stored_bytes`` = the file's tensor bytes (GGUF, safetensors, llama2.c float32), None when
    unknown; ``stored_format`` e.g. ``"Q4_1 ×210, F32 ×61"``; ``dtype`` the stored/default
    precision name. Dimensions are None when not known (flags given without them)."""

    source: str
    name: str
    params: int
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    hidden: int | None = None
    intermediate: int | None = None
    vocab: int | None = None
    context_length: int | None = None
    tied: bool | None = None
    stored_bytes: int | None = None
    stored_format: str | None = None
    dtype: str = "fp16"


def parse_count(text: str | int | float, flag: str = "--params") -> int:
    """``7B``, ``70e9``, ``135M``, ``6.7b``, ``1.2T``, ``260K`` or a plain integer → a count.

    Raises:
        PlanError: not a count, not finite (``1e400``), or not positive (naming ``flag``).
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([kKmMbBgGtT]?)\s*", str(text))
    if not m:
        raise PlanError(flag, f"{text!r} is not a count (e.g. 7B, 135M, 70e9)")
    scale = {"": 1, "k": 10 ** 3, "m": 10 ** 6, "b": 10 ** 9, "g": 10 ** 9, "t": 10 ** 12}[m.group(2).lower()]
    number = float(m.group(1)) * scale
    if not math.isfinite(number):
        raise PlanError(flag, f"{text!r} is too large to be a count")
    value = round(number)
    if value < 1:
        raise PlanError(flag, f"must be >= 1, got {text!r}")
    return value


def llama_params(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
                 vocab: int, tied: bool) -> int:
    """Weight elements of a Llama-family decoder (the engine's ``canonical_weight_names``):
    embeddings (+ classifier when untied), per layer two RMSNorm vectors, Q/K/V/O and the
    SwiGLU gate/up/down matrices, and the final norm."""
    per_layer = (2 * hidden + hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
                 + heads * head_dim * hidden + 3 * hidden * intermediate)
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden


def _llama(source: str, name: str, *, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
           intermediate: int, vocab: int, tied: bool, ctx: int | None, **kw: Any) -> ModelDims:
    params = kw.pop("params", None) or llama_params(layers, hidden, heads, kv_heads, head_dim, intermediate,
                                                    vocab, tied)
    return ModelDims(source, name, params, layers, heads, kv_heads, head_dim, hidden, intermediate, vocab,
                     ctx, tied, **kw)


def _read_llama2c(p: Path) -> ModelDims:
    """A llama2.c checkpoint's header (legacy, or export version 1: float32), and its size
    checked against what the header implies (engine/loader.py refuses the same files)."""
    with p.open("rb") as fh:
        buf = fh.read(256)
    size = p.stat().st_size
    if len(buf) < 28:
        raise PlanError("--model", f"{p}: {len(buf)} bytes is too short for a llama2.c header")
    version = 0
    if struct.unpack_from("<I", buf, 0)[0] == LLAMA2C_MAGIC:
        (version,) = struct.unpack_from("<i", buf, 4)
        if version != 1:
            raise PlanError("--model", f"{p}: llama2.c export version {version} is not supported "
                                       "(only legacy and version 1 float32)")
        if len(buf) < 256:
            raise PlanError("--model", f"{p}: truncated: {size} bytes, shorter than the 256-byte version-1 header")
        dim, hidden, layers, heads, kv, vocab, seq = struct.unpack_from("<7i", buf, 8)
        tied = bool(buf[36])
    else:
        dim, hidden, layers, heads, kv, vocab, seq = struct.unpack_from("<7i", buf, 0)
        tied, vocab = vocab > 0, abs(vocab)
    if min(dim, hidden, layers, heads, kv, vocab, seq) < 1 or dim % heads or heads % kv:
        raise PlanError("--model", f"{p}: not a llama2.c checkpoint (header dim={dim}, layers={layers}, "
                                   f"heads={heads}, kv_heads={kv})")
    d = _llama("llama2.c", p.name, layers=layers, hidden=dim, heads=heads, kv_heads=kv, head_dim=dim // heads,
               intermediate=hidden, vocab=vocab, tied=tied, ctx=seq, dtype="fp32")
    expected = expected_bytes(version, dim, hidden, layers, heads, kv, vocab, seq, tied)
    if size != expected:
        raise PlanError("--model", f"{p}: {'truncated' if size < expected else 'too long'}: the header (dim={dim}, "
                                   f"hidden={hidden}, layers={layers}, heads={heads}, kv_heads={kv}, vocab={vocab}, "
                                   f"seq_len={seq}, shared classifier={tied}) implies {expected:,} bytes, the file "
                                   f"has {size:,}")
    d.stored_bytes, d.stored_format = 4 * d.params, "float32"
    return d


def _safetensors_sizes(folder: Path) -> tuple[int, int, dict[str, int]] | None:
    """(elements, bytes, dtype → tensors) over the folder's ``*.safetensors`` headers, or None."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    elems = nbytes = 0
    kinds: dict[str, int] = {}
    for f in files:
        try:
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > f.stat().st_size - 8:
                    raise ValueError(f"its header length {n} runs past the end of the file")
                header = json.loads(fh.read(n))
            for key, t in header.items():
                if key == "__metadata__":
                    continue
                elems += math.prod(int(x) for x in t["shape"])
                nbytes += int(t["data_offsets"][1]) - int(t["data_offsets"][0])
                kinds[str(t["dtype"])] = kinds.get(str(t["dtype"]), 0) + 1
        except (OSError, struct.error, ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise PlanError("--model", f"{f}: not a readable safetensors header ({type(exc).__name__}: "
                                       f"{exc})") from None
    return elems, nbytes, kinds


def _read_hf_dir(p: Path) -> ModelDims:
    cfg_path = p / "config.json"
    if not cfg_path.is_file():
        raise PlanError("--model", f"{p}: a directory without config.json (not a Hugging Face model folder)")
    try:
        c = json.loads(cfg_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlanError("--model", f"{cfg_path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:   # json.JSONDecodeError, UnicodeDecodeError
        raise PlanError("--model", f"{cfg_path}: not valid JSON ({exc})") from None
    if not isinstance(c, dict):
        raise PlanError("--model", f"{cfg_path}: must be a JSON object of the model's settings, "
                                   f"got {type(c).__name__}")

    def count(key: str, required: bool = True) -> int | None:
        """``c[key]`` as an integer >= 1; None for an optional key that is absent or null."""
        v = c.get(key)
        if v is None:
            if required:
                raise PlanError("--model", f"{cfg_path}: missing key {key!r} (needs hidden_size, num_hidden_layers, "
                                           "num_attention_heads, intermediate_size, vocab_size)")
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (
                isinstance(v, float) and (not math.isfinite(v) or v != int(v))) or v < 1:
            raise PlanError("--model", f"{cfg_path}: key {key!r} must be an integer >= 1, got {repr(v)[:40]}")
        if v > MAX_DIMENSION:
            raise PlanError("--model", f"{cfg_path}: key {key!r} must be at most {MAX_DIMENSION:,}, got "
                                       f"{str(v)[:40]}{'…' if len(str(v)) > 40 else ''}")
        return int(v)

    hidden, heads = count("hidden_size"), count("num_attention_heads")
    kv_heads, head_dim = count("num_key_value_heads", False) or heads, count("head_dim", False)
    if head_dim is None and hidden % heads:
        raise PlanError("--model", f"{cfg_path}: key 'hidden_size' ({hidden}) must be a multiple of "
                                   f"'num_attention_heads' ({heads}) when there is no 'head_dim'")
    if heads % kv_heads:
        raise PlanError("--model", f"{cfg_path}: key 'num_key_value_heads' ({kv_heads}) must divide "
                                   f"'num_attention_heads' ({heads})")
    tied = c.get("tie_word_embeddings")
    tied = False if tied is None else tied     # transformers' default when absent or null
    if not isinstance(tied, bool):
        raise PlanError("--model", f"{cfg_path}: key 'tie_word_embeddings' must be true or false, got {tied!r}"[:300])
    kw = dict(layers=count("num_hidden_layers"), hidden=hidden, heads=heads, kv_heads=kv_heads,
              head_dim=head_dim or hidden // heads, intermediate=count("intermediate_size"),
              vocab=count("vocab_size"), tied=tied, ctx=count("max_position_embeddings", False))
    key = "torch_dtype" if "torch_dtype" in c else "dtype"      # transformers >= 4.56 writes "dtype"
    raw = c.get(key)
    if isinstance(raw, str) and raw.startswith("torch."):
        raw = raw[len("torch."):]
    if raw is None or raw == "auto":
        dtype = "bf16"
    elif isinstance(raw, str) and raw in HF_DTYPES:
        dtype = HF_DTYPES[raw]
    else:      # a precision plan does not know: fine with --precision, refused without (compute_plan)
        dtype = f"{UNKNOWN_DTYPE}{key}={str(raw)[:40]!r}"
    st = _safetensors_sizes(p)
    extra: dict[str, Any] = {"dtype": dtype}
    if st is not None:
        extra.update(params=st[0], stored_bytes=st[1],
                     stored_format=", ".join(f"{k} ×{v}" for k, v in sorted(st[2].items())))
    return _llama("hf", p.name, **kw, **extra)


def _read_gguf(p: Path) -> ModelDims:
    try:
        from gguf import GGUFReader

        r = GGUFReader(str(p))
    except Exception as exc:   # the reader raises ValueError/struct errors on a bad file
        raise PlanError("--model", f"{p}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None

    def get(key: str, default: Any = None) -> Any:
        f = r.fields.get(key)
        return default if f is None else f.contents()

    arch = get("general.architecture", "llama")
    try:
        heads = int(get(f"{arch}.attention.head_count"))
        hidden = int(get(f"{arch}.embedding_length"))
        vocab = get(f"{arch}.vocab_size") or len(r.fields["tokenizer.ggml.tokens"].data)
        kw = dict(layers=int(get(f"{arch}.block_count")), hidden=hidden, heads=heads,
                  kv_heads=int(get(f"{arch}.attention.head_count_kv", heads)),
                  head_dim=int(get(f"{arch}.attention.key_length") or hidden // heads),
                  intermediate=int(get(f"{arch}.feed_forward_length")), vocab=int(vocab),
                  tied=not any(t.name == "output.weight" for t in r.tensors), ctx=get(f"{arch}.context_length"))
    except (TypeError, KeyError, ValueError) as exc:
        raise PlanError("--model", f"{p}: GGUF metadata lacks the {arch} dimensions ({exc})") from None
    kinds: dict[str, int] = {}
    for t in r.tensors:
        kinds[t.tensor_type.name] = kinds.get(t.tensor_type.name, 0) + 1
    return _llama("gguf", p.name, **kw, params=sum(int(t.n_elements) for t in r.tensors),
                  stored_bytes=sum(int(t.n_bytes) for t in r.tensors), dtype="stored",
                  stored_format=", ".join(f"{k} ×{v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))


def read_model(model: str) -> ModelDims:
    """Dimensions of a local model: a directory (Hugging Face: ``config.json`` + safetensors
    headers), a GGUF file (metadata and tensor table only), else a llama2.c checkpoint header.

    Raises:
        PlanError: (``--model``) missing path, a hub id, or a file the readers do not recognise.
    """
    p = Path(model).expanduser()
    if not p.exists():
        if _HUB_ID.match(model) and not model.startswith((".", "/")):
            raise PlanError("--model", f"{model!r} looks like a Hugging Face hub id: hub ids are not downloaded; "
                                       "give a local path")
        raise PlanError("--model", f"{model}: no such file or directory")
    if p.is_dir():
        return _read_hf_dir(p)
    with p.open("rb") as fh:
        magic = fh.read(4)
    if magic == b"GGUF" or p.suffix.lower() == ".gguf":
        return _read_gguf(p)
    return _read_llama2c(p)


def dims_from_flags(params: str | None = None, layers: int | None = None, heads: int | None = None,
                    kv_heads: int | None = None, head_dim: int | None = None, hidden: int | None = None,
                    intermediate: int | None = None, vocab: int | None = None, tied: bool = False) -> ModelDims:
    """A model given by flags. ``--params`` alone is enough for weights; KV needs ``--layers``,
    ``--kv-heads`` and ``--head-dim`` (or ``--hidden`` and ``--heads``); the engine's activation
    estimate needs every dimension. Without ``--params`` the Llama layout gives it from the dims.

    Raises:
        PlanError: a value below 1 or above :data:`MAX_DIMENSION`, ``--kv-heads`` not dividing
            ``--heads``, ``--hidden`` not a multiple of ``--heads`` (without ``--head-dim``), or
            too little to count the parameters (naming the flag).
    """
    given = {"--layers": layers, "--heads": heads, "--kv-heads": kv_heads, "--head-dim": head_dim,
             "--hidden": hidden, "--intermediate": intermediate, "--vocab": vocab}
    for flag, v in given.items():
        if v is not None and v < 1:
            raise PlanError(flag, f"must be an integer >= 1, got {v}")
        if v is not None and v > MAX_DIMENSION:
            raise PlanError(flag, f"must be at most {MAX_DIMENSION:,}, got {str(v)[:40]}")
    if head_dim is None and hidden and heads:
        if hidden % heads:
            raise PlanError("--hidden", f"must be a multiple of --heads ({heads}) when --head-dim is not given, "
                                        f"got {hidden}")
        head_dim = hidden // heads
    if kv_heads is None:
        kv_heads = heads
    if heads is not None and heads % kv_heads:   # GQA: each KV head serves heads / kv_heads query heads
        raise PlanError("--kv-heads", f"must divide --heads ({heads}) (grouped-query attention), got {kv_heads}")
    n = parse_count(params) if params is not None else None
    if n is None:
        missing = [f for f, v in given.items() if v is None and f not in ("--kv-heads", "--head-dim")]
        if missing:
            raise PlanError("--params", "give --params (e.g. 7B), a --model, or every dimension "
                                        f"(missing {', '.join(missing)})")
        n = llama_params(layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, tied)
    return ModelDims("flags", "given dimensions", n, layers, heads, kv_heads, head_dim, hidden, intermediate,
                     vocab, None, tied)


@dataclass
class GpuFit:
    """One GPU of the table against a plan (bytes, tokens/s)."""

    gpu: str
    memory_bytes: int
    usable_bytes: int
    fits: bool
    gpus_needed: int
    decode_tokens_per_s: float
    decode_tokens_per_s_at_context: float | None
    bandwidth_bytes_per_s: int
    source: str


@dataclass
class Plan:
    """The planner's answer (bytes unless named otherwise; None = cannot be computed from what
    was given, never 0)."""

    model: dict[str, Any]
    precision: str
    kv_cache_dtype: str
    context: int
    concurrency: int
    gpu_memory_utilization: float
    weights_bytes: int
    weights_formula_bytes: int
    weights_stored_bytes: int | None
    kv_bytes_per_token: int | None
    kv_bytes: int | None
    activations: dict[str, int | None]
    total_bytes: int | None
    gpus: list[GpuFit] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    draft: dict[str, Any] | None = None     # tools/plan_draft.DraftFigures with --speculative-config

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def activation_figures(d: ModelDims, context: int, concurrency: int, act_bytes: int,
                       max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS) -> dict[str, int | None]:
    """Per-step activation bytes (see the module doc): ``notes_term`` (seq² × heads × hidden ×
    bytes, one sequence), ``unfused_attention_scores`` (2 × concurrency × heads × context² ×
    bytes), ``engine_profile_step`` (what the engine reserves: one ``max_num_batched_tokens``
    prefill) and ``engine_worst_step`` (the larger of a prefill chunk ending at ``context``
    and a decode step of ``concurrency`` sequences at ``context``). None where a dimension is
    missing."""
    out: dict[str, int | None] = {"notes_term": None, "unfused_attention_scores": None,
                                  "engine_profile_step": None, "engine_worst_step": None}
    if d.heads and d.hidden:
        out["notes_term"] = context * context * d.heads * d.hidden * act_bytes
    if d.heads:
        out["unfused_attention_scores"] = 2 * concurrency * d.heads * context * context * act_bytes
    if None in (d.hidden, d.heads, d.kv_heads, d.head_dim, d.intermediate, d.vocab):
        return out
    from inferctl.engine.memory_plan import estimate_step_activation_bytes

    dim = d.heads * d.head_dim     # the engine's estimate takes kv_dim = kv_heads × dim / heads

    def step(tokens: int, logits: int, q_ctx: int, ctx: int) -> int:
        return estimate_step_activation_bytes(tokens, logits, q_ctx, ctx, dim, d.intermediate, d.heads,
                                              d.kv_heads, d.vocab, act_bytes)

    b = max_num_batched_tokens
    chunk = min(b, context * concurrency)
    out["engine_profile_step"] = step(b, 1, b * b, b)
    out["engine_worst_step"] = max(step(chunk, 1, chunk * context, context),
                                   step(concurrency, concurrency, concurrency * context, concurrency * context))
    return out


def compute_plan(d: ModelDims, precision: str = "auto", context: int | None = None, concurrency: int = 1,
                 kv_cache_dtype: str = "auto", gpu_memory_utilization: float = 0.9,
                 max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                 speculative_config: str | dict | None = None) -> Plan:
    """The plan (module doc) for ``d``. ``context`` None = the model's own context length.
    ``speculative_config`` (vLLM's JSON): a draft model's weights, KV pool and step are added
    (tools/plan_draft.py).

    Raises:
        PlanError: unknown precision / KV dtype, a context or concurrency below 1 or above
            :data:`MAX_CONTEXT` / :data:`MAX_CONCURRENCY`, a utilization
            outside (0, 1], no context known, or a bad speculative config / draft (naming the flag).
    """
    try:
        spec = parse_flag(speculative_config)
    except DraftError as exc:
        raise PlanError(SPEC_FLAG, str(exc)) from None
    notes: list[str] = []
    if precision not in ("auto", *PRECISION_BITS):
        raise PlanError("--precision", f"{precision!r} is not one of auto, {', '.join(PRECISION_BITS)}")
    if kv_cache_dtype not in ("auto", *KV_DTYPE_BYTES):
        raise PlanError("--kv-cache-dtype", f"{kv_cache_dtype!r} is not one of auto, {', '.join(KV_DTYPE_BYTES)}")
    ctx = context if context is not None else d.context_length
    if ctx is None:
        raise PlanError("--context", "give the context length in tokens (the model does not say its own)")
    if context is None and isinstance(ctx, int) and ctx > MAX_CONTEXT:
        notes.append(f"the model's context length {ctx:,} is past the planner's bound: planned at "
                     f"{MAX_CONTEXT:,} tokens")
        ctx = MAX_CONTEXT
    for flag, v in (("--context", ctx), ("--concurrency", concurrency),
                    ("--max-num-batched-tokens", max_num_batched_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlanError(flag, f"must be an integer >= 1, got {v!r}")
    for flag, v, limit, what in (("--context", ctx, MAX_CONTEXT, "tokens"),
                                 ("--concurrency", concurrency, MAX_CONCURRENCY, "sequences")):
        if v > limit:
            raise PlanError(flag, f"must be at most {limit:,} {what}, got {v:,}")
    if not 0 < gpu_memory_utilization <= 1:
        raise PlanError("--gpu-memory-utilization", f"must be in (0, 1], got {gpu_memory_utilization}")
    prec = precision
    if prec == "auto":
        if d.dtype.startswith(UNKNOWN_DTYPE):
            raise PlanError("--precision", f"the model's config.json gives {d.dtype[len(UNKNOWN_DTYPE):]}, a precision"
                                           " plan does not know (float32, bfloat16, float16): give --precision")
        prec = "stored" if d.dtype == "stored" else d.dtype
    formula = d.params * PRECISION_BITS.get(prec, 16) // 8
    if prec == "stored":
        weights = d.stored_bytes
        formula = d.params * 16 // 8
        notes.append(f"weights as stored in the file ({d.stored_format}); at fp16 they would be "
                     f"{formula:,} bytes")
    else:
        weights = formula
    if prec == "int4" and None not in (d.vocab, d.hidden, d.layers):  # engine/quant_int4.py's layout
        from inferctl.engine.quant import int8_weight_nbytes

        n_tab = 1 if d.tied is not False else 2
        norms = (2 * d.layers + 1) * d.hidden
        tables = n_tab * d.vocab * d.hidden
        eng = ((d.params - norms - tables) * 5 // 8 + n_tab * int8_weight_nbytes(d.vocab, d.hidden)
               + 4 * norms)
        notes.append(f"this engine's --precision int4 holds {eng:,} bytes of weights: every layer linear as "
                     "GGUF Q4_1 blocks (fp16 d and m per 32 weights, 0.625 B/weight; engine/q4_kernels.py), "
                     f"the classifier{'' if n_tab == 1 else ' and embedding'} int8 per row, norms fp32")
    act_bytes = 4 if prec == "fp32" else 2
    kvd = kv_cache_dtype if kv_cache_dtype != "auto" else ("fp32" if prec == "fp32" else "fp16")
    kv_tok = (2 * d.layers * d.kv_heads * d.head_dim * KV_DTYPE_BYTES[kvd]
              if None not in (d.layers, d.kv_heads, d.head_dim) else None)
    kv = kv_tok * ctx * concurrency if kv_tok is not None else None
    if kv_tok is None:
        notes.append("KV cache: no data (needs --layers, --kv-heads and --head-dim, or a --model)")
    if d.context_length and ctx > d.context_length:
        notes.append(f"--context {ctx} is past the model's trained context ({d.context_length})")
    acts = activation_figures(d, ctx, concurrency, act_bytes, max_num_batched_tokens)
    worst = acts["engine_worst_step"]
    try:
        dr = draft_figures(spec, d, PRECISION_BITS.get(prec), KV_DTYPE_BYTES[kvd], kv_tok, ctx, concurrency,
                           act_bytes, notes, read_model=read_model, worst_step=lambda m: activation_figures(
                               m, ctx, concurrency, act_bytes, max_num_batched_tokens)["engine_worst_step"])
    except DraftError as exc:
        raise PlanError(SPEC_FLAG, str(exc)) from None
    d_known = [0] if dr is None else [dr.weights_bytes, dr.kv_bytes]
    if dr is not None and worst is not None and dr.worst_step_bytes is not None:
        worst = max(worst, dr.worst_step_bytes)   # one headroom serves both models (plan_draft)
    total = weights + kv + worst + sum(d_known) if None not in (kv, worst, *d_known) else None
    need = total if total is not None else weights + (kv or 0) + sum(v or 0 for v in d_known)
    if total is None:
        notes.append("total: weights + KV only (the activation estimate needs every dimension)"
                     if kv is not None else "total: weights only")
    fits = []
    for g in GPUS:
        usable = int(g.memory_bytes * gpu_memory_utilization)
        at_ctx = g.bandwidth_bytes_per_s / (weights + kv_tok * ctx) if kv_tok is not None else None
        fits.append(GpuFit(g.name, g.memory_bytes, usable, need <= usable, max(1, -(-need // usable)),
                           g.bandwidth_bytes_per_s / weights, at_ctx, g.bandwidth_bytes_per_s, g.source))
    model = {k: v for k, v in asdict(d).items()}
    return Plan(model, prec, kvd, ctx, concurrency, gpu_memory_utilization, weights, formula,
                d.stored_bytes, kv_tok, kv, acts, total if total is not None else need, fits, notes, as_dict(dr))


def render_rows(plan: Plan) -> tuple[list[tuple[str, str, str]], list[tuple[str, ...]]]:
    """(summary rows ``(quantity, value, how)``, GPU rows) as text, binary units."""
    from inferctl.contract.units import format_bytes

    m, a = plan.model, plan.activations
    dims = ", ".join(f"{k} {m[k]}" for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate",
                                             "vocab") if m.get(k) is not None)
    rows = [("model", f"{m['name']} ({m['source']})", f"{m['params']:,} parameters" + (f"; {dims}" if dims else "")),
            ("weights", format_bytes(plan.weights_bytes),
             f"{plan.weights_bytes:,} bytes = " + (f"as stored in the file ({m['stored_format']})"
                                                   if plan.precision == "stored"
                                                   else f"params × {PRECISION_BITS[plan.precision]} bits / 8"))]
    if plan.weights_stored_bytes is not None and plan.precision != "stored":
        rows.append(("weights as stored", format_bytes(plan.weights_stored_bytes),
                     f"{plan.weights_stored_bytes:,} bytes in the file ({m['stored_format']})"))
    kvt = plan.kv_bytes_per_token
    rows.append(("KV cache per token", format_bytes(kvt),
                 "no data" if kvt is None else f"2 × {m['layers']} layers × {m['kv_heads']} KV heads × "
                 f"{m['head_dim']} head dim × {KV_DTYPE_BYTES[plan.kv_cache_dtype]} bytes ({plan.kv_cache_dtype})"))
    rows.append(("KV cache", format_bytes(plan.kv_bytes),
                 f"× {plan.context:,} tokens × {plan.concurrency} sequences"))
    rows += [("activations (notes' term)", format_bytes(a["notes_term"]),
              "seq² × heads × hidden × bytes, one sequence: over-counts (the score matrix has no × hidden)"),
             ("activations (unfused scores)", format_bytes(a["unfused_attention_scores"]),
              "2 × concurrency × heads × context² × bytes: one layer's scores + probabilities, eager attention; "
              "0 with fused/flash or paged kernels"),
             ("activations (engine, per step)", format_bytes(a["engine_worst_step"]),
              "this engine's estimate of its worst step (prefill chunk or full-context decode); "
              f"it reserves {format_bytes(a['engine_profile_step'])} for its profile step"),
             ("total", format_bytes(plan.total_bytes), "weights + KV cache + engine activations"
              + (" + the draft's weights and KV cache" if plan.draft else ""))]
    if plan.draft:
        dr = plan.draft
        rows[-1:-1] = [("draft weights", format_bytes(dr["weights_bytes"]), f"{dr['method']}: {dr['name']}"),
                       ("draft KV cache", format_bytes(dr["kv_bytes"]),
                        f"{format_bytes(dr['kv_bytes_per_token'])} per token × {plan.context:,} tokens × "
                        f"{plan.concurrency} sequences (as many blocks as the target's)")]
    gpu_rows = [(g.gpu, format_bytes(g.memory_bytes), format_bytes(g.usable_bytes),
                 "yes" if g.fits else f"no: needs {g.gpus_needed}", f"{g.bandwidth_bytes_per_s / 1e12:.3g} TB/s",
                 f"{g.decode_tokens_per_s:,.0f}",
                 "-" if g.decode_tokens_per_s_at_context is None else f"{g.decode_tokens_per_s_at_context:,.0f}")
                for g in plan.gpus]
    return rows, gpu_rows


def precision_words(plan: Plan) -> str:
    """The plan's precision for its title: the ``--precision`` name (``fp16``), or for a GGUF
    file planned as stored (``--precision auto``) "the file's own precision" and its tensor
    types (``Q4_1 ×210, F32 ×61``)."""
    if plan.precision != "stored":
        return plan.precision
    fmt = plan.model.get("stored_format")
    return "the file's own precision" + (f" ({fmt})" if fmt else "")


GPU_HEADERS = ("gpu", "memory", "usable", "fits on one", "bandwidth", "decode bound tok/s (batch 1)",
               "at full context")


def _plain(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [headers, *rows])


def register(app: Any) -> None:
    """Add ``inferctl plan`` to the typer ``app``."""
    import sys

    import typer

    @app.command("plan")
    def plan(
        model: Optional[str] = typer.Argument(None, metavar="MODEL", help="Same as --model."),
        model_opt: Optional[str] = typer.Option(None, "--model", metavar="PATH",
                                                help="A local llama2.c .bin, Hugging Face directory or .gguf file."),
        precision: str = typer.Option("auto", "--precision", metavar="PRECISION",
                                      help="fp32, bf16, fp16, int8, int4, or auto (the file's own; a GGUF as stored)."),
        context: Optional[int] = typer.Option(None, "--context", metavar="TOKENS",
                                              help="Tokens per sequence (default: the model's context length)."),
        concurrency: int = typer.Option(1, "--concurrency", metavar="N", help="Sequences at full context at once."),
        kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", metavar="DTYPE",
                                           help="fp32, bf16, fp16, fp8, int8, or auto (fp32 for fp32, else 16 bits)."),
        gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", metavar="FRACTION",
                                                     help="Share of each GPU's memory the plan may use (vLLM's)."),
        max_num_batched_tokens: int = typer.Option(DEFAULT_MAX_NUM_BATCHED_TOKENS, "--max-num-batched-tokens",
                                                   metavar="TOKENS", help="The engine's per-step token budget."),
        params: Optional[str] = typer.Option(None, "--params", metavar="COUNT", help="Parameters, e.g. 7B, 135M."),
        layers: Optional[int] = typer.Option(None, "--layers", metavar="N"),
        heads: Optional[int] = typer.Option(None, "--heads", metavar="N", help="Attention (query) heads."),
        kv_heads: Optional[int] = typer.Option(None, "--kv-heads", metavar="N", help="KV heads (GQA)."),
        head_dim: Optional[int] = typer.Option(None, "--head-dim", metavar="N", help="Default --hidden / --heads."),
        hidden: Optional[int] = typer.Option(None, "--hidden", metavar="N", help="Model (embedding) width."),
        intermediate: Optional[int] = typer.Option(None, "--intermediate", metavar="N", help="MLP width."),
        vocab: Optional[int] = typer.Option(None, "--vocab", metavar="N"),
        speculative_config: Optional[str] = typer.Option(
            None, "--speculative-config", metavar="JSON",
            help="The engine's flag: a draft model (int8_self, draft_model) adds its weights and KV cache."),
        as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON (bytes)."),
    ) -> None:
        """Memory for a model at a precision, context and concurrency — weights, KV cache,
        activations — the GPUs it fits on and the batch-1 decode bound (docs/cli.md)."""
        def fail(exc: PlanError) -> None:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2)

        try:
            if model and model_opt and model != model_opt:
                raise PlanError("--model", f"given twice ({model!r} and {model_opt!r})")
            spec = model or model_opt
            flags = {"--params": params, "--layers": layers, "--heads": heads, "--kv-heads": kv_heads,
                     "--head-dim": head_dim, "--hidden": hidden, "--intermediate": intermediate, "--vocab": vocab}
            if spec is not None:
                extra = [f for f, v in flags.items() if v is not None]
                if extra:
                    raise PlanError(extra[0], "give either --model or the dimension flags, not both")
                dims = read_model(spec)
            elif any(v is not None for v in flags.values()):
                dims = dims_from_flags(params, layers, heads, kv_heads, head_dim, hidden, intermediate, vocab)
            else:
                raise PlanError("--model", "give a model (a .bin, .gguf or Hugging Face directory) or its "
                                           "dimensions (--params 7B --layers 32 --kv-heads 32 --head-dim 128)")
            result = compute_plan(dims, precision, context, concurrency, kv_cache_dtype, gpu_memory_utilization,
                                  max_num_batched_tokens, speculative_config)
        except PlanError as exc:
            fail(exc)
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=1))
            return
        rows, gpu_rows = render_rows(result)
        title = (f"plan: {result.model['name']} at {precision_words(result)}, context {result.context:,}, "
                 f"concurrency {result.concurrency}, KV {result.kv_cache_dtype}")
        if sys.stdout.isatty():
            from rich.console import Console
            from rich.table import Table

            t = Table(title=title)
            for h in ("quantity", "value", "how"):
                t.add_column(h)
            for r in rows:
                t.add_row(*r)
            g = Table(title=f"GPUs (keeping {result.gpu_memory_utilization:.0%} of memory; NVIDIA datasheets)")
            for h in GPU_HEADERS:
                g.add_column(h, justify="left" if h == "gpu" else "right")
            for r in gpu_rows:
                g.add_row(*r)
            con = Console(highlight=False)
            con.print(t)
            con.print(g)
        else:
            typer.echo(title)
            typer.echo(_plain(("quantity", "value", "how"), rows))
            typer.echo("")
            typer.echo(f"GPUs (keeping {result.gpu_memory_utilization:.0%} of memory; NVIDIA datasheets)")
            typer.echo(_plain(GPU_HEADERS, gpu_rows))
        for n in result.notes:
            typer.echo(f"note: {n}", err=True)
