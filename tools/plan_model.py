"""``inferctl plan``'s model: the dimensions the planner needs (:class:`ModelDims`), read from a
local model — a llama2.c ``.bin`` (its header, size checked), a Hugging Face directory
(``config.json`` and the safetensors headers) or a GGUF file (only its metadata and tensor table
are read, with ``gguf.GGUFReader``; nothing is dequantized) — by :func:`read_model`, or given as
flags (:func:`dims_from_flags`; ``--params 7B``: :func:`parse_count`; the Llama layout counts
parameters from the dimensions, :func:`llama_params`).

Errors are :class:`PlanError` naming the flag (``--context: must be an integer >= 1, got -5``);
every planner module raises it.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferctl.contract.jsonvalues import MAX_DIMENSION, json_integer
from inferctl.engine.llama2c_format import LLAMA2C_MAGIC, expected_bytes

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
        n = json_integer(v)
        if n is None or n < 1:
            raise PlanError("--model", f"{cfg_path}: key {key!r} must be an integer >= 1, got {repr(v)[:40]}")
        if n > MAX_DIMENSION:
            raise PlanError("--model", f"{cfg_path}: key {key!r} must be at most {MAX_DIMENSION:,}, got "
                                       f"{str(v)[:40]}{'…' if len(str(v)) > 40 else ''}")
        return n

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

