"""GGUF model files (llama.cpp's format): Llama metadata → :class:`ModelArgs`, tensors → fp32.

Format: the GGUF specification (``gguf.md`` in the docs folder of github.com/ggml-org/ggml): a key/value metadata block
(``general.architecture``, ``llama.block_count``, ``tokenizer.ggml.tokens`` …) and named
tensors stored in ggml types (F32, F16, BF16, Q8_0, Q4_0, Q4_1, K-quants …). Reading and
dequantizing use the ``gguf`` package (``gguf.GGUFReader``, ``gguf.quants.dequantize``), the
reference Python implementation that ships with llama.cpp; nothing here decodes a block itself.

What loads: ``general.architecture`` "llama" with a byte-level BPE tokenizer
(``tokenizer.ggml.model`` "gpt2"). Every tensor type ``gguf.quants.dequantize`` knows loads
(F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K…Q6_K, IQ*, TQ*); another type raises
ValueError naming the tensor and its type. Weights are dequantized to float32 at load (a
Q4_1 file of N parameters takes 4·N bytes of memory once loaded: SmolLM2-135M, 98 MB on disk,
≈ 540 MB in fp32).

RoPE layout: llama.cpp's ``convert_hf_to_gguf.py`` (``LlamaModel.permute``) reorders the
rows of ``attn_q``/``attn_k`` from Hugging Face's rotate-half layout back to Meta's
interleaved pair layout, and llama.cpp rotates pairs (0,1),(2,3)… (``LLAMA_ROPE_TYPE_NORM``).
That is the engine's ``rope_style="interleaved"``, so the rows are used as stored: undoing
the permutation would only be needed for the "half" style (transformers' GGUF loader does it,
``_reverse_permute_weights``, because its model rotates halves). Keeping the stored order
also lets :func:`iter_raw_tensors` hand quantized rows to a kernel unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inferctl.engine.model import ModelArgs, canonical_weight_names
from inferctl.engine.tokenizer import GGUFTokenizer

#: GGUF tensor name → canonical (Meta/llama2.c) name; ``{i}`` is the block index.
_GGUF_TO_CANON = {
    "attn_norm.weight": "attention_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "attn_q.weight": "attention.wq.weight",
    "attn_k.weight": "attention.wk.weight",
    "attn_v.weight": "attention.wv.weight",
    "attn_output.weight": "attention.wo.weight",
    "ffn_gate.weight": "feed_forward.w1.weight",
    "ffn_down.weight": "feed_forward.w2.weight",
    "ffn_up.weight": "feed_forward.w3.weight",
}
_TOP_LEVEL = {"token_embd.weight": "tok_embeddings.weight", "output_norm.weight": "norm.weight",
              "output.weight": "output.weight"}

#: Architectures whose GGUF layout is llama's (same tensor names, same rope).
SUPPORTED_ARCHITECTURES = ("llama",)


@dataclass(frozen=True)
class RawTensor:
    """One tensor as stored in the file, not dequantized.

    ``name``: the GGUF name (``blk.0.attn_q.weight``); ``canonical``: the engine's name
    (``layers.0.attention.wq.weight``) or None for a tensor the engine does not use;
    ``ggml_type``: the type's name ("Q4_1", "F32" …); ``shape``: the logical shape in torch
    order (``[out, in]`` for a matrix: GGUF's ``ne`` reversed); ``data``: the bytes/values as
    ``GGUFReader`` maps them (uint8 blocks ``[rows, bytes_per_row]`` for quantized types, the
    element dtype otherwise), a read-only view of the memory-mapped file.
    """

    name: str
    canonical: str | None
    ggml_type: str
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass
class GGUFModel:
    """What :func:`read_gguf_model` returns: args, canonical fp32 weights, tokenizer, metadata."""

    args: ModelArgs
    weights: dict[str, torch.Tensor]
    tokenizer: GGUFTokenizer
    metadata: dict[str, Any]
    chat_template: str | None
    name: str


#: GGUF's fixed header: magic ``GGUF``, uint32 version, uint64 tensor count, uint64 metadata
#: key/value count (the GGUF specification, gguf.md of https://github.com/ggml-org/ggml, "File Structure").
GGUF_MAGIC = b"GGUF"
GGUF_HEADER_BYTES = 24
#: The GGUF versions the ``gguf`` package reads (version 1 files were never widely written).
GGUF_VERSIONS = (2, 3)


def gguf_header_error(p: Path) -> str | None:
    """Why ``p`` cannot be a GGUF file by its fixed header alone (empty, shorter than the
    24-byte header, no ``GGUF`` magic, an unknown version), or None. Either byte order."""
    size = p.stat().st_size
    if size == 0:
        return "the file is empty (0 bytes)"
    with open(p, "rb") as f:
        head = f.read(GGUF_HEADER_BYTES)
    if head[:4] != GGUF_MAGIC:
        return (f"not a GGUF file: it starts with {head[:4]!r}, not the GGUF magic {GGUF_MAGIC!r} "
                "(a llama2.c .bin, a Hugging Face directory or a .gguf file is expected)")
    if size < GGUF_HEADER_BYTES:
        return f"truncated: the file is {size} bytes, shorter than the {GGUF_HEADER_BYTES}-byte GGUF header"
    version = int.from_bytes(head[4:8], "little")
    if version not in GGUF_VERSIONS and int.from_bytes(head[4:8], "big") not in GGUF_VERSIONS:
        return f"GGUF version {version} is not supported (versions {', '.join(map(str, GGUF_VERSIONS))})"
    return None


def open_gguf(path: str | Path):
    """A ``gguf.GGUFReader`` over ``path``.

    Raises FileNotFoundError if missing; ValueError naming the path and what is wrong when the
    file is not GGUF (empty, no magic, unknown version: :func:`gguf_header_error`) or is
    truncated or corrupt past its header (its metadata or tensor table points past the end of
    the file or holds impossible values: the file size is given, the reader's own words follow).
    """
    import gguf

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"GGUF file not found: {p}")
    why = gguf_header_error(p)
    if why is not None:
        raise ValueError(f"{p}: {why}")
    try:
        return gguf.GGUFReader(str(p), "r")
    except (ValueError, OSError, IndexError, KeyError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: truncated or corrupt GGUF file ({p.stat().st_size} bytes): its metadata or tensor "
                         f"table points past the end of the file or holds impossible values (gguf reader: "
                         f"{type(e).__name__}: {e})") from e


def read_metadata(reader) -> dict[str, Any]:
    """All metadata fields as Python values (strings, numbers, bools, lists)."""
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        out[key] = field.contents()
    return out


def _canonical_name(name: str) -> str | None:
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    if name.startswith("blk."):
        idx, _, sub = name[4:].partition(".")
        if idx.isdigit() and sub in _GGUF_TO_CANON:
            return f"layers.{int(idx)}.{_GGUF_TO_CANON[sub]}"
    return None


def iter_raw_tensors(path_or_reader) -> Iterator[RawTensor]:
    """Every tensor of a GGUF file as stored (quantized blocks untouched), in file order.

    For a kernel that computes on the quantized weights directly (a 4-bit mode): the rows of
    ``attn_q``/``attn_k`` are in the interleaved RoPE layout the engine's llama models use, so
    no reordering is needed. Takes a path or an open reader.
    """
    reader = open_gguf(path_or_reader) if isinstance(path_or_reader, (str, Path)) else path_or_reader
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed([int(x) for x in t.shape]))
        yield RawTensor(name=t.name, canonical=_canonical_name(t.name), ggml_type=t.tensor_type.name,
                        shape=shape, data=t.data)


def dequantize(raw: RawTensor) -> torch.Tensor:
    """fp32 tensor of ``raw.shape`` via ``gguf.quants.dequantize``. ValueError naming the tensor
    and its type when the ``gguf`` package cannot dequantize that type."""
    import gguf

    qtype = gguf.GGMLQuantizationType[raw.ggml_type]
    try:
        arr = gguf.quants.dequantize(raw.data, qtype)
    except NotImplementedError as e:
        raise ValueError(f"tensor {raw.name!r} has GGML type {raw.ggml_type}, which cannot be dequantized "
                         f"(gguf package: {e})") from e
    arr = np.asarray(arr, dtype=np.float32).reshape(raw.shape)
    return torch.from_numpy(arr.copy())


def _get(meta: dict[str, Any], key: str, path: Path, default: Any = None, required: bool = True) -> Any:
    if key in meta:
        return meta[key]
    if required and default is None:
        raise ValueError(f"{path}: GGUF metadata has no {key!r}")
    return default


def model_args_from_metadata(meta: dict[str, Any], path: str | Path, n_tokens: int | None = None) -> ModelArgs:
    """:class:`ModelArgs` from llama GGUF metadata (``{arch}.block_count``, ``embedding_length``,
    ``attention.head_count[_kv]``, ``feed_forward_length``, ``rope.freq_base``,
    ``attention.layer_norm_rms_epsilon``, ``context_length``, ``vocab_size``,
    ``attention.key_length``, ``rope.dimension_count``). Tied embeddings are decided by the
    caller (no ``output.weight`` tensor). Raises ValueError naming the file and the key."""
    p = Path(path)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{p}: GGUF architecture {arch!r} is not supported "
                         f"(only {', '.join(SUPPORTED_ARCHITECTURES)})")
    k = f"{arch}."
    n_heads = int(_get(meta, k + "attention.head_count", p))
    dim = int(_get(meta, k + "embedding_length", p))
    head_dim = meta.get(k + "attention.key_length")
    head_dim = int(head_dim) if head_dim is not None else dim // n_heads
    rope_dims = meta.get(k + "rope.dimension_count")
    if rope_dims is not None and int(rope_dims) != head_dim:
        raise ValueError(f"{p}: {k}rope.dimension_count={rope_dims} (partial rotary) is not supported; "
                         f"head dim is {head_dim}")
    scaling = meta.get(k + "rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"{p}: {k}rope.scaling.type={scaling!r} is not supported")
    vocab = meta.get(k + "vocab_size", n_tokens)
    if vocab is None:
        raise ValueError(f"{p}: GGUF metadata has neither {k}vocab_size nor tokenizer.ggml.tokens")
    try:
        return ModelArgs(
            dim=dim, n_layers=int(_get(meta, k + "block_count", p)), n_heads=n_heads,
            n_kv_heads=int(meta.get(k + "attention.head_count_kv", n_heads)), vocab_size=int(vocab),
            hidden_dim=int(_get(meta, k + "feed_forward_length", p)),
            max_seq_len=int(_get(meta, k + "context_length", p)),
            norm_eps=float(meta.get(k + "attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(meta.get(k + "rope.freq_base", 10000.0)), rope_style="interleaved",
            tie_embeddings=True, head_dim=head_dim)
    except ValueError as e:
        raise ValueError(f"{p}: inconsistent GGUF metadata: {e}") from e


def tokenizer_from_metadata(meta: dict[str, Any], path: str | Path) -> GGUFTokenizer:
    """A :class:`GGUFTokenizer` from ``tokenizer.ggml.*`` metadata. ValueError (naming the file)
    for a tokenizer model other than "gpt2" (byte-level BPE) or missing tokens/merges."""
    p = Path(path)
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"{p}: tokenizer.ggml.model={model!r} is not supported (only 'gpt2', byte-level BPE)")
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise ValueError(f"{p}: GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    if eos is None:
        raise ValueError(f"{p}: GGUF metadata has no tokenizer.ggml.eos_token_id")
    return GGUFTokenizer(tokens=list(tokens), merges=list(merges),
                         token_types=list(meta.get("tokenizer.ggml.token_type") or []),
                         bos_id=int(bos) if bos is not None else None, eos_id=int(eos),
                         add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                         pre=meta.get("tokenizer.ggml.pre"), name=p.stem)


def read_gguf_model(path: str | Path) -> GGUFModel:
    """Read a llama GGUF file: args, fp32 canonical weights ``[out, in]`` (module docstring of
    :mod:`inferctl.engine.model`), tokenizer, chat template, metadata.

    Raises FileNotFoundError (missing file) and ValueError (not GGUF, unsupported
    architecture/tokenizer/tensor type, missing or mis-shaped tensor), naming the file.
    """
    p = Path(path)
    reader = open_gguf(p)
    meta = read_metadata(reader)
    tokens = meta.get("tokenizer.ggml.tokens")
    args = model_args_from_metadata(meta, p, n_tokens=len(tokens) if tokens else None)
    weights: dict[str, torch.Tensor] = {}
    for raw in iter_raw_tensors(reader):
        if raw.name == "rope_freqs.weight":
            raise ValueError(f"{p}: tensor rope_freqs.weight (RoPE frequency factors, Llama 3.1-style scaling) "
                             "is not supported in GGUF files")
        if raw.canonical is None:
            continue  # e.g. rope tables some converters add; not used by the model
        try:
            weights[raw.canonical] = dequantize(raw)
        except ValueError as e:
            raise ValueError(f"{p}: {e}") from e
    args.tie_embeddings = "output.weight" not in weights
    expected = canonical_weight_names(args)
    missing = [n for n in expected if n not in weights]
    if missing:
        raise ValueError(f"{p}: tensors missing for the metadata's shape: {missing[:5]}")
    for n, shape in expected.items():
        if tuple(weights[n].shape) != shape:
            raise ValueError(f"{p}: tensor for {n} has shape {tuple(weights[n].shape)}, metadata implies {shape}")
    tok = tokenizer_from_metadata(meta, p)
    if tok.vocab_size > args.vocab_size:
        raise ValueError(f"{p}: tokenizer has {tok.vocab_size} tokens, model vocab is {args.vocab_size}")
    return GGUFModel(args=args, weights=weights, tokenizer=tok, metadata=meta,
                     chat_template=meta.get("tokenizer.chat_template"), name=p.stem)
