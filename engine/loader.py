"""Model loading and conversion: llama2.c checkpoints, Hugging Face Llama directories, the demo model.

``load_model(spec)`` dispatches: ``None`` → :func:`build_demo_model`; a ``.bin`` file →
:func:`load_llama2c`; a ``.gguf`` file → :func:`load_gguf`; a directory → :func:`load_hf_dir`. Every loader returns a
:class:`ModelBundle`. Bad inputs raise FileNotFoundError / ValueError naming the path and
what is wrong.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from inferctl.contract.envflags import check_switches
from inferctl.engine import hugepages
from inferctl.engine.llama2c_format import LLAMA2C_MAGIC, expected_bytes
from inferctl.contract.jsonvalues import MAX_DIMENSION, json_integer, json_number
from inferctl.engine.model import LlamaModel, ModelArgs, canonical_weight_names
from inferctl.engine.tokenizer import (BaseTokenizer, ByteTokenizer, HFTokenizer, Llama2cTokenizer,
                              build_hf_tokenizer_json)



@dataclass
class ModelBundle:
    """A loaded model with its tokenizer. ``source_path`` is None for the demo model."""

    name: str
    model: LlamaModel
    tokenizer: BaseTokenizer
    args: ModelArgs
    source_path: str | None = None
    #: Extra token ids that end a generation besides the tokenizer's EOS. llama2.c's TinyStories
    #: checkpoints delimit stories with BOS (id 1), and llama2.c's ``run.c`` stops generating when
    #: it samples BOS ("data-dependent terminating condition: the BOS (=1) token delimits
    #: sequences"), so ``load_llama2c`` sets ``(bos_id,)``. ``ignore_eos`` disables these too.
    stop_token_ids: tuple[int, ...] = ()
    #: The model's own Jinja chat template (GGUF ``tokenizer.chat_template``), None when it has none.
    chat_template: str | None = None


def _tensor(buf: bytes, offset: int, shape: tuple[int, ...], path: Path, what: str) -> tuple[torch.Tensor, int]:
    n = int(np.prod(shape))
    end = offset + 4 * n
    if end > len(buf):
        raise ValueError(f"{path}: truncated while reading {what} {shape}: "
                         f"needs bytes {offset}..{end}, file has {len(buf)}")
    arr = np.frombuffer(buf, dtype="<f4", count=n, offset=offset).reshape(shape)
    return torch.from_numpy(arr.copy()), end


def _find_llama2c_tokenizer(path: Path) -> Path:
    for name in ("tokenizer.bin", "tok512.bin"):
        cand = path.parent / name
        if cand.is_file():
            return cand
    others = sorted(path.parent.glob("tok*.bin"))
    if len(others) == 1:
        return others[0]
    raise FileNotFoundError(f"no llama2.c tokenizer beside {path}: looked for tokenizer.bin, tok512.bin "
                            f"(found {[o.name for o in others]}); pass tokenizer_path")


def load_llama2c(path: str | Path, tokenizer_path: str | Path | None = None, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, name: str | None = None) -> ModelBundle:
    """Load a llama2.c checkpoint (``run.c`` layout).

    Legacy format: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
    seq_len; a negative vocab_size means an unshared classifier), then float32 weights in
    the order token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final,
    freq_cis_real, freq_cis_imag (skipped), [wcls]. Also reads export.py "version 1" (magic
    "ak42", float32, 256-byte header). The tokenizer defaults to ``tokenizer.bin`` or
    ``tok512.bin`` beside the checkpoint. RoPE layout: "interleaved".

    Raises FileNotFoundError (checkpoint or tokenizer missing) and ValueError (bad header,
    wrong size, unsupported version) naming the path.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"llama2.c checkpoint not found: {p}")
    buf = p.read_bytes()
    if len(buf) < 28:
        raise ValueError(f"{p}: {len(buf)} bytes is too short for a llama2.c header (28 bytes)")
    (magic,) = struct.unpack_from("<I", buf, 0)
    version = 0
    if magic == LLAMA2C_MAGIC:
        (version,) = struct.unpack_from("<i", buf, 4)
        if version != 1:
            raise ValueError(f"{p}: llama2.c export version {version} is not supported "
                             "(only legacy and version 1 float32)")
        if len(buf) < 256:
            raise ValueError(f"{p}: truncated version-1 header")
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack_from("<7i", buf, 8)
        shared = bool(buf[36])
        off = 256
    else:
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack_from("<7i", buf, 0)
        shared = vocab > 0
        vocab = abs(vocab)
        off = 28
    for field, val in (("dim", dim), ("hidden_dim", hidden), ("n_layers", n_layers), ("n_heads", n_heads),
                       ("n_kv_heads", n_kv), ("vocab_size", vocab), ("seq_len", seq_len)):
        if val < 1 or val > 1 << 24:
            raise ValueError(f"{p}: header field {field}={val} is not plausible; not a llama2.c checkpoint?")
    if dim % n_heads or n_heads % n_kv:
        raise ValueError(f"{p}: header dim={dim}, n_heads={n_heads}, n_kv_heads={n_kv} are inconsistent")
    args = ModelArgs(dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv, vocab_size=vocab,
                     hidden_dim=hidden, max_seq_len=seq_len, rope_style="interleaved", tie_embeddings=shared)
    hd = dim // n_heads
    kv_dim = n_kv * hd
    L = n_layers
    expected = expected_bytes(version, dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len, shared)
    if len(buf) != expected:
        raise ValueError(f"{p}: file has {len(buf)} bytes, header (dim={dim}, hidden={hidden}, layers={L}, "
                         f"heads={n_heads}, kv_heads={n_kv}, vocab={vocab}, seq_len={seq_len}, "
                         f"shared_classifier={shared}) implies {expected}")
    w: dict[str, torch.Tensor] = {}

    def read(shape: tuple[int, ...], what: str) -> torch.Tensor:
        nonlocal off
        t, off = _tensor(buf, off, shape, p, what)
        return t

    def per_layer(name: str, shape: tuple[int, ...]) -> None:
        t = read((L, *shape), name)
        for i in range(L):
            w[f"layers.{i}.{name}"] = t[i]

    if version == 0:
        w["tok_embeddings.weight"] = read((vocab, dim), "token_embedding_table")
        per_layer("attention_norm.weight", (dim,))
        per_layer("attention.wq.weight", (dim, dim))
        per_layer("attention.wk.weight", (kv_dim, dim))
        per_layer("attention.wv.weight", (kv_dim, dim))
        per_layer("attention.wo.weight", (dim, dim))
        per_layer("ffn_norm.weight", (dim,))
        per_layer("feed_forward.w1.weight", (hidden, dim))
        per_layer("feed_forward.w2.weight", (dim, hidden))
        per_layer("feed_forward.w3.weight", (hidden, dim))
        w["norm.weight"] = read((dim,), "rms_final_weight")
        off += 4 * seq_len * hd  # freq_cis_real + freq_cis_imag (seq_len × hd/2 each), recomputed
    else:
        per_layer("attention_norm.weight", (dim,))
        per_layer("ffn_norm.weight", (dim,))
        w["norm.weight"] = read((dim,), "rms_final_weight")
        w["tok_embeddings.weight"] = read((vocab, dim), "token_embedding_table")
        per_layer("attention.wq.weight", (dim, dim))
        per_layer("attention.wk.weight", (kv_dim, dim))
        per_layer("attention.wv.weight", (kv_dim, dim))
        per_layer("attention.wo.weight", (dim, dim))
        per_layer("feed_forward.w1.weight", (hidden, dim))
        per_layer("feed_forward.w2.weight", (dim, hidden))
        per_layer("feed_forward.w3.weight", (hidden, dim))
    if not shared:
        w["output.weight"] = read((vocab, dim), "wcls")
    tok_path = Path(tokenizer_path) if tokenizer_path is not None else _find_llama2c_tokenizer(p)
    tok = Llama2cTokenizer(tok_path)
    if tok.vocab_size != vocab:
        raise ValueError(f"{tok_path}: tokenizer has {tok.vocab_size} tokens, checkpoint {p} has vocab_size {vocab}")
    model = LlamaModel(args, w, device=device, dtype=dtype)
    return ModelBundle(name=name or p.stem, model=model, tokenizer=tok, args=args, source_path=str(p),
                       stop_token_ids=(tok.bos_id,))


# ---- Hugging Face ------------------------------------------------------------------------

_HF_TO_CANON = {
    "self_attn.q_proj.weight": "attention.wq.weight",
    "self_attn.k_proj.weight": "attention.wk.weight",
    "self_attn.v_proj.weight": "attention.wv.weight",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def _permute_interleaved_to_half(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder wq/wk rows so rotate_half RoPE equals llama2.c's pairwise RoPE.

    Within each head, rows (0,1),(2,3)… become (0, D/2), (1, D/2+1)…: the permutation of
    transformers' ``convert_llama_weights_to_hf.py``: view(H, D/2, 2, in).transpose(1, 2).
    """
    out, inp = w.shape
    return w.view(n_heads, out // n_heads // 2, 2, inp).transpose(1, 2).reshape(out, inp).contiguous()


def _given(cfg: dict, key: str, default: object) -> object:
    """``cfg[key]``, or ``default`` when the key is absent or null (a 0 or ``false`` is a value, and
    is checked as one: it no longer stood for "absent")."""
    value = cfg.get(key)
    return default if value is None else value


def _flag(cfg: dict, key: str, cfg_path: Path) -> bool:
    """``cfg[key]`` as a JSON boolean (absent or null: false, transformers' default); ValueError naming
    the key for anything else (``"no"`` read as true before)."""
    value = _given(cfg, key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{cfg_path}: field {key!r} must be true or false, got {repr(value)[:40]}")
    return value


def _token_id(cfg: dict, key: str, vocab_size: int, cfg_path: Path) -> int | None:
    """``cfg[key]`` as a token id in ``[0, vocab_size)``; None when absent, null or a list (several ids:
    the tokenizer's own then); ValueError naming the key for anything else (``true``, -5 and 1e30 were
    taken as ids before)."""
    value = cfg.get(key)
    if value is None or isinstance(value, list):
        return None
    n = json_integer(value)
    if n is None or not 0 <= n < vocab_size:
        raise ValueError(f"{cfg_path}: field {key!r} must be a token id from 0 to {vocab_size - 1}, "
                         f"got {repr(value)[:40]}")
    return n


def _config_value(value: object, count: bool, what: str, cfg_path: Path) -> int | float:
    """``value`` of the config field ``what`` names (``"field 'hidden_size'"``): with ``count`` an integer
    from 1 to ``MAX_DIMENSION``, else a finite number above 0; ValueError naming the file and the field
    otherwise (a string, a null, a bool, a fraction where a count goes, 0 or less, beyond the bound or
    float's range)."""
    n = json_integer(value) if count else json_number(value)
    if n is None or n <= 0 or (count and n > MAX_DIMENSION):
        rule = f"an integer from 1 to {MAX_DIMENSION:,}" if count else "a finite number above 0"
        raise ValueError(f"{cfg_path}: {what} must be {rule}, got {repr(value)[:40]}")
    return n


def _rope_scaling(cfg: dict, cfg_path: Path) -> dict:
    """:class:`ModelArgs` RoPE-scaling fields from ``rope_scaling`` (transformers 4.x) or
    ``rope_parameters`` (5.x): ``rope_type``/``type`` "linear" (``factor``) or "llama3"
    (``factor``, ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``);
    "default" or absent → none. ValueError naming the file for another type or a missing key."""
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(rs, dict):
        raise ValueError(f"{cfg_path}: rope_scaling must be an object, got {rs!r}")
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return {}
    if kind not in ("linear", "llama3"):
        raise ValueError(f"{cfg_path}: rope_scaling type {kind!r} is not supported (only 'linear' and 'llama3')")
    def field(key: str, count: bool = False) -> float | int:
        if key not in rs:
            raise ValueError(f"{cfg_path}: rope_scaling of type {kind!r} lacks {key!r}")
        return _config_value(rs[key], count, f"rope_scaling field {key!r}", cfg_path)

    out = {"rope_scaling_type": kind, "rope_scaling_factor": field("factor")}
    if kind == "llama3":
        out.update(rope_low_freq_factor=field("low_freq_factor"), rope_high_freq_factor=field("high_freq_factor"),
                   rope_original_max_seq_len=field("original_max_position_embeddings", count=True))
    return out


def load_hf_dir(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                name: str | None = None) -> ModelBundle:
    """Load a Hugging Face Llama directory: ``config.json``, ``*.safetensors``, ``tokenizer.json``.

    Supports ``model_type`` "llama" without biases, with ``rope_scaling`` of type "linear" or
    "llama3" (Llama 3.x) or none. RoPE layout
    "half". Raises FileNotFoundError for a missing file and ValueError for an unsupported or
    inconsistent config/weights (naming the file and the field).
    """
    from safetensors import safe_open

    d = Path(path)
    if not d.is_dir():
        raise FileNotFoundError(f"Hugging Face model directory not found: {d}")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{d}: no config.json")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except ValueError as e:   # UnicodeDecodeError too
        raise ValueError(f"{cfg_path}: invalid JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_path}: must be a JSON object of the model's settings, got {type(cfg).__name__}")
    if cfg.get("model_type", "llama") != "llama":
        raise ValueError(f"{cfg_path}: model_type {cfg.get('model_type')!r} is not supported (only 'llama')")
    scaling = _rope_scaling(cfg, cfg_path)
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError(f"{cfg_path}: attention_bias/mlp_bias are not supported")

    def number(key: str, kind: type = int, value: object = None) -> int | float:
        """``cfg[key]`` (or ``value``, its default applied) through :func:`_config_value`: a count
        (``kind`` int) or a finite number above 0 (``kind`` float: ``rms_norm_eps``, ``rope_theta``)."""
        v = cfg[key] if value is None else value
        return _config_value(v, kind is int, f"field {key!r}", cfg_path)

    try:
        n_heads = number("num_attention_heads")
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None and isinstance(cfg.get("rope_parameters"), dict):
            rope_theta = cfg["rope_parameters"].get("rope_theta")
        args = ModelArgs(
            dim=number("hidden_size"), n_layers=number("num_hidden_layers"), n_heads=n_heads,
            n_kv_heads=number("num_key_value_heads", value=_given(cfg, "num_key_value_heads", n_heads)),
            vocab_size=number("vocab_size"), hidden_dim=number("intermediate_size"),
            max_seq_len=number("max_position_embeddings", value=_given(cfg, "max_position_embeddings", 2048)),
            norm_eps=number("rms_norm_eps", float, _given(cfg, "rms_norm_eps", 1e-6)),
            rope_theta=number("rope_theta", float, 10000.0 if rope_theta is None else rope_theta),
            rope_style="half", tie_embeddings=_flag(cfg, "tie_word_embeddings", cfg_path),
            head_dim=number("head_dim") if cfg.get("head_dim") is not None else None, **scaling)
    except KeyError as e:
        raise ValueError(f"{cfg_path}: missing field {e.args[0]!r}") from e
    except ValueError as e:   # ModelArgs: a size below 1, heads that do not divide
        raise ValueError(str(e) if str(e).startswith(str(cfg_path)) else f"{cfg_path}: {e}") from None
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{d}: no *.safetensors weights")
    raw: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                for k in sf.keys():
                    raw[k] = sf.get_tensor(k)
        except Exception as e:  # safetensors raises SafetensorError (an Exception subclass)
            raise ValueError(f"{f}: cannot read safetensors: {e}") from e
    w: dict[str, torch.Tensor] = {}
    for k, t in raw.items():
        if k == "model.embed_tokens.weight":
            w["tok_embeddings.weight"] = t
        elif k == "model.norm.weight":
            w["norm.weight"] = t
        elif k == "lm_head.weight":
            w["output.weight"] = t
        elif k.startswith("model.layers."):
            rest = k[len("model.layers."):]
            idx, _, sub = rest.partition(".")
            if sub in _HF_TO_CANON:
                w[f"layers.{idx}.{_HF_TO_CANON[sub]}"] = t
        # rotary_emb.inv_freq and other buffers are ignored
    if args.tie_embeddings:
        w.pop("output.weight", None)
    elif "output.weight" not in w:
        raise ValueError(f"{d}: tie_word_embeddings is false but there is no lm_head.weight")
    layers = {int(k.split(".")[1]) for k in w if k.startswith("layers.") and k.split(".")[1].isdigit()}
    if args.n_layers != len(layers):   # before listing the config's layers: 1e30 of them never ended
        raise ValueError(f"{cfg_path}: field 'num_hidden_layers' is {args.n_layers:,} but the weights hold "
                         f"{len(layers)} layer(s)")
    missing = [n for n in canonical_weight_names(args) if n not in w]
    if missing:
        raise ValueError(f"{d}: weights missing from *.safetensors: {missing[:5]}")
    tok = HFTokenizer(d / "tokenizer.json", bos_id=_token_id(cfg, "bos_token_id", args.vocab_size, cfg_path),
                      eos_id=_token_id(cfg, "eos_token_id", args.vocab_size, cfg_path))
    if tok.vocab_size > args.vocab_size:
        raise ValueError(f"{d}: tokenizer has {tok.vocab_size} tokens, config vocab_size is {args.vocab_size}")
    model = LlamaModel(args, w, device=device, dtype=dtype)
    return ModelBundle(name=name or d.name, model=model, tokenizer=tok, args=args, source_path=str(d))


def save_hf_dir(bundle: ModelBundle, path: str | Path) -> Path:
    """Write ``bundle`` as a Hugging Face Llama directory (config.json, model.safetensors,
    tokenizer.json, tokenizer_config.json) loadable by :func:`load_hf_dir` and by
    transformers' ``LlamaForCausalLM``.

    Weights are written in float32 from the full-precision copy (also in int8 mode). For an
    "interleaved" (llama2.c) model the wq/wk rows are permuted to the rotate_half layout. The
    tokenizer must be a Llama2cTokenizer (converted by ``build_hf_tokenizer_json``) or an
    HFTokenizer (copied). Raises ValueError otherwise.
    """
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    a = bundle.args
    canon = bundle.model.export_weights()
    st: dict[str, torch.Tensor] = {"model.embed_tokens.weight": canon["tok_embeddings.weight"],
                                   "model.norm.weight": canon["norm.weight"]}
    if not a.tie_embeddings:
        st["lm_head.weight"] = canon["output.weight"]
    inv = {v: k for k, v in _HF_TO_CANON.items()}
    for i in range(a.n_layers):
        for cname, hname in inv.items():
            t = canon[f"layers.{i}.{cname}"]
            if a.rope_style == "interleaved" and cname == "attention.wq.weight":
                t = _permute_interleaved_to_half(t, a.n_heads)
            elif a.rope_style == "interleaved" and cname == "attention.wk.weight":
                t = _permute_interleaved_to_half(t, a.n_kv_heads)
            st[f"model.layers.{i}.{hname}"] = t.to(torch.float32).contiguous()
    st = {k: v.to(torch.float32).contiguous() for k, v in st.items()}
    save_file(st, str(out / "model.safetensors"), metadata={"format": "pt"})
    tok = bundle.tokenizer
    if isinstance(tok, Llama2cTokenizer):
        (out / "tokenizer.json").write_text(build_hf_tokenizer_json(tok), encoding="utf-8")
        bos, eos = "<s>", "</s>"
    elif isinstance(tok, HFTokenizer):
        (out / "tokenizer.json").write_text(tok.path.read_text(encoding="utf-8"), encoding="utf-8")
        bos, eos = tok.id_to_piece(tok.bos_id), tok.id_to_piece(tok.eos_id)
    else:
        raise ValueError(f"save_hf_dir: cannot convert a {type(tok).__name__} to tokenizer.json")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": a.dim, "intermediate_size": a.hidden_dim, "num_hidden_layers": a.n_layers,
        "num_attention_heads": a.n_heads, "num_key_value_heads": a.n_kv_heads, "head_dim": a.head_dim,
        "vocab_size": a.vocab_size, "max_position_embeddings": a.max_seq_len, "rms_norm_eps": a.norm_eps,
        "rope_theta": a.rope_theta, "tie_word_embeddings": a.tie_embeddings, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id,
        "torch_dtype": "float32",
    }
    if a.rope_scaling_type == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": a.rope_scaling_factor}
    elif a.rope_scaling_type == "llama3":
        config["rope_scaling"] = {"rope_type": "llama3", "factor": a.rope_scaling_factor,
                                  "low_freq_factor": a.rope_low_freq_factor,
                                  "high_freq_factor": a.rope_high_freq_factor,
                                  "original_max_position_embeddings": a.rope_original_max_seq_len}
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    tcfg = {"bos_token": bos, "eos_token": eos, "unk_token": "<unk>", "add_bos_token": True,
            "add_eos_token": False, "model_max_length": a.max_seq_len, "tokenizer_class": "PreTrainedTokenizerFast"}
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2), encoding="utf-8")
    return out


# ---- GGUF ---------------------------------------------------------------------------------

def load_gguf(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
              name: str | None = None) -> ModelBundle:
    """Load a llama GGUF file (:mod:`inferctl.engine.gguf`): weights dequantized to fp32 (then
    cast to ``dtype``), the byte-level BPE tokenizer and the chat template from the metadata.

    Generation stops at the metadata's EOS (``tokenizer.ggml.eos_token_id``; SmolLM2:
    ``<|im_end|>``, id 2). Raises FileNotFoundError / ValueError naming the file.
    """
    from inferctl.engine.gguf import read_gguf_model

    g = read_gguf_model(path)
    model = LlamaModel(g.args, g.weights, device=device, dtype=dtype)
    del g.weights
    from inferctl.engine.gguf import iter_raw_tensors  # Q4 blocks kept (mmap views) for precision int4
    model.q4_sources = {r.canonical: r for r in iter_raw_tensors(path) if r.ggml_type in ("Q4_0", "Q4_1")}
    return ModelBundle(name=name or g.name, model=model, tokenizer=g.tokenizer, args=g.args,
                       source_path=str(Path(path)), chat_template=g.chat_template)


# ---- demo and dispatch ---------------------------------------------------------------------

def build_demo_model(seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                     max_seq_len: int = 4096) -> ModelBundle:
    """A tiny seeded random Llama over bytes (ByteTokenizer), so the product runs with no files.

    dim 64, 2 layers, 4 heads / 2 KV heads, hidden 172, vocab 259; weights N(0, 0.02²) from
    ``torch.Generator().manual_seed(seed)``, norms 1. Same seed → same weights.
    """
    tok = ByteTokenizer()
    args = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=tok.vocab_size, hidden_dim=172,
                     max_seq_len=max_seq_len, rope_style="interleaved", tie_embeddings=True)
    g = torch.Generator().manual_seed(seed)
    w = {}
    for n, shape in canonical_weight_names(args).items():
        if len(shape) == 1:
            w[n] = torch.ones(shape)
        else:
            w[n] = torch.randn(shape, generator=g) * 0.02
    model = LlamaModel(args, w, device=device, dtype=dtype)
    return ModelBundle(name="demo", model=model, tokenizer=tok, args=args, source_path=None)


def load_model(spec: str | Path | None, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               tokenizer_path: str | Path | None = None, name: str | None = None) -> ModelBundle:
    """Load by spec: None or "demo" → demo model; ``*.bin`` → llama2.c; ``*.gguf`` → GGUF; a directory →
    Hugging Face.

    On CPU the full-precision weights are then moved into huge pages (``engine.hugepages``; off with
    ``INFERCTL_HUGEPAGES=0``). Raises FileNotFoundError for a missing path and ValueError for a path
    of another kind, or for an engine switch set to an unknown word (``INFERCTL_CPU_KERNELS``,
    ``INFERCTL_ONEDNN``, ``INFERCTL_HUGEPAGES``: contract/envflags.py), before reading anything.
    """
    check_switches()
    bundle = _load_by_spec(spec, device, dtype, tokenizer_path, name)
    hugepages.move_weights(bundle.model)     # CPU weights only; INFERCTL_HUGEPAGES=0 turns it off
    return bundle


def _load_by_spec(spec: str | Path | None, device: str | torch.device, dtype: torch.dtype,
                  tokenizer_path: str | Path | None, name: str | None) -> ModelBundle:
    if spec is None or str(spec) == "demo":
        b = build_demo_model(device=device, dtype=dtype)
        if name:
            b.name = name
        return b
    p = Path(spec)
    if p.is_dir():
        return load_hf_dir(p, device=device, dtype=dtype, name=name)
    if not p.exists():
        raise FileNotFoundError(f"model not found: {p}")
    if p.suffix == ".bin":
        return load_llama2c(p, tokenizer_path=tokenizer_path, device=device, dtype=dtype, name=name)
    if p.suffix.lower() == ".gguf":
        return load_gguf(p, device=device, dtype=dtype, name=name)
    raise ValueError(f"{p}: unknown model format (expected a llama2.c .bin file, a .gguf file or a "
                     "Hugging Face directory)")
