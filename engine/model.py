"""Llama-family decoder over the paged KV cache: RMSNorm, RoPE, GQA, SwiGLU.

Architecture per Touvron et al. 2023 (LLaMA, arXiv:2302.13971) and the llama2.c reference
(``run.c``): pre-norm RMSNorm (Zhang & Sennrich 2019), rotary embeddings (Su et al. 2021,
arXiv:2104.09864) with ``theta = 10000``, grouped-query attention (Ainslie et al. 2023,
arXiv:2305.13245), SwiGLU feed-forward (Shazeer 2020, arXiv:2002.05202).

Weights are exchanged with loaders as a "canonical" dict in the Meta/llama2.c naming, every
linear weight laid out ``[out, in]`` like ``nn.Linear``::

    tok_embeddings.weight [vocab, dim]        norm.weight [dim]      output.weight [vocab, dim] (untied only)
    layers.{i}.attention_norm.weight [dim]    layers.{i}.ffn_norm.weight [dim]
    layers.{i}.attention.wq.weight [H*D, dim] .wk / .wv [Hkv*D, dim]  .wo [dim, H*D]
    layers.{i}.feed_forward.w1 [hidden, dim] (gate)  .w3 [hidden, dim] (up)  .w2 [dim, hidden] (down)

Inside the model the full-precision linears are stored transposed and contiguous (``[in,
out]``) so ``x @ W`` streams the weight in order — on the project CPU this ran ~2× faster
than ``x @ W.T`` on the ``[out, in]`` layout for a 384×32000 matrix at batch 1 (1.6 ms vs 3.3 ms,
see ``engine.quant.bench_int8_vs_full``). Q/K/V are fused into one matrix and gate/up into
another, which halves the number of small ops per layer (per-op overhead dominates tiny
models). The tied embedding is stored once, as the classifier's ``[dim, vocab]`` matrix; the
embedding lookup gathers its columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, asdict
from typing import Any, Literal

import torch

from inferctl.engine import cpu_kernels, fused_decode, onednn
from inferctl.engine.attention import AttentionMetadata, KVCache, paged_attention
from inferctl.engine.quant import Int8Weight, int8_matmul, int8_weight_nbytes, quantize_per_channel
from inferctl.engine.quant_int4 import INT4_TYPES, int4_matmul, int4_mode_nbytes, int4_weights

PRECISIONS = ("full", "int8", "int4")


@dataclass
class ModelArgs:
    """Hyper-parameters of a Llama-family model.

    ``rope_style``: "interleaved" (llama2.c / Meta: rotate pairs (0,1),(2,3)…) or "half"
    (Hugging Face ``rotate_half``: pairs (i, i+D/2)); it describes the layout of the wq/wk
    rows the model was given. ``head_dim`` defaults to ``dim // n_heads``.
    """

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    hidden_dim: int
    max_seq_len: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_style: str = "interleaved"
    tie_embeddings: bool = True
    head_dim: int | None = None
    #: RoPE frequency scaling (Hugging Face ``rope_scaling``): None, "linear" (position
    #: interpolation, Chen et al. 2023 arXiv:2306.15595: every frequency / factor) or "llama3"
    #: (Meta Llama 3.1: low frequencies / factor, high kept, a smooth ramp between; see
    #: :func:`rope_inv_freq`).
    rope_scaling_type: str | None = None
    rope_scaling_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_seq_len: int = 8192

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim", "max_seq_len"):
            val = getattr(self, name)
            if not isinstance(val, int) or val < 1:
                raise ValueError(f"ModelArgs.{name} must be a positive int, got {val!r}")
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(f"ModelArgs.n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim is None:
            if self.dim % self.n_heads != 0:
                raise ValueError(f"ModelArgs.dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
            self.head_dim = self.dim // self.n_heads
        if self.head_dim % 2 != 0:
            raise ValueError(f"ModelArgs.head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_style not in ("interleaved", "half"):
            raise ValueError(f"ModelArgs.rope_style must be 'interleaved' or 'half', got {self.rope_style!r}")
        if self.rope_scaling_type not in (None, "linear", "llama3"):
            raise ValueError(f"ModelArgs.rope_scaling_type must be None, 'linear' or 'llama3', "
                             f"got {self.rope_scaling_type!r}")
        if not self.rope_scaling_factor > 0 or not self.rope_high_freq_factor > self.rope_low_freq_factor > 0:
            raise ValueError("ModelArgs: rope_scaling_factor must be > 0 and rope_high_freq_factor > "
                             f"rope_low_freq_factor > 0, got {self.rope_scaling_factor}, "
                             f"{self.rope_high_freq_factor}, {self.rope_low_freq_factor}")

    def to_dict(self) -> dict:
        return asdict(self)


def canonical_weight_names(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Expected canonical weight names → shapes for ``args`` (see module docstring)."""
    D, H, Hkv = args.head_dim, args.n_heads, args.n_kv_heads
    names: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (args.vocab_size, args.dim),
                                         "norm.weight": (args.dim,)}
    if not args.tie_embeddings:
        names["output.weight"] = (args.vocab_size, args.dim)
    for i in range(args.n_layers):
        p = f"layers.{i}."
        names[p + "attention_norm.weight"] = (args.dim,)
        names[p + "ffn_norm.weight"] = (args.dim,)
        names[p + "attention.wq.weight"] = (H * D, args.dim)
        names[p + "attention.wk.weight"] = (Hkv * D, args.dim)
        names[p + "attention.wv.weight"] = (Hkv * D, args.dim)
        names[p + "attention.wo.weight"] = (args.dim, H * D)
        names[p + "feed_forward.w1.weight"] = (args.hidden_dim, args.dim)
        names[p + "feed_forward.w2.weight"] = (args.dim, args.hidden_dim)
        names[p + "feed_forward.w3.weight"] = (args.hidden_dim, args.dim)
    return names


class Linear(torch.nn.Module):
    """A bias-free linear with two storage modes, its weight layout chosen at load.

    full, CPU float32, under ``cpu_kernels.GEMV_F32_MAX_BYTES`` (every weight since wave 7, the classifier
    too), with the engine's CPU kernels built (``layout == "out_in"``, engine.cpu_kernels):
    ``weight`` [out, in] contiguous; batches where ``cpu_kernels.f32_kernel_wins`` run the
    kernels' GEMV (one contiguous weight row per output), larger ones ``x @ weight.T`` through
    oneDNN's GEMM where it is usable (engine.onednn), else torch's (MKL).
    full otherwise (``layout == "in_out"``): ``weight`` [in, out] contiguous, ``y = x @ weight``
    (torch at every batch size: never numpy's BLAS, whose OpenBLAS thread pool left spinning beside
    torch's OpenMP pool made the next ops 60× slower at 2 threads, docs/performance.md).
    ``weight_t`` is the [in, out] view of either layout (None when quantized); assigning an
    [in, out] tensor to it stores it in the layout.
    int8: ``qweight`` int8 [out, in] + ``scales`` float32 [out] (engine.quant), ``weight_t`` None;
    small batches run the kernels' int8 GEMV (fp32 activations) where the kernels are built.
    """

    def __init__(self, w_out_in: torch.Tensor):
        super().__init__()
        self.ops = cpu_kernels.ops_for(w_out_in.device, w_out_in.dtype)
        small = w_out_in.numel() * w_out_in.element_size() < cpu_kernels.GEMV_F32_MAX_BYTES
        self.layout = "out_in" if self.ops is not None and small else "in_out"
        self.weight: torch.Tensor | None = None
        self.weight_t = w_out_in.t()
        self.q: Int8Weight | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # every replacement of the stored weight (quantize_, restore_, the weight_t setter, the int4
        # start's ``lin.q = …``) invalidates the fused decode's cached weight lists (engine.fused_decode)
        if name in ("weight", "q"):
            fused_decode.weights_changed()
        super().__setattr__(name, value)

    @property
    def weight_t(self) -> torch.Tensor | None:
        """The full-precision weight as [in, out] (a transposed view in the "out_in" layout)."""
        if self.weight is None:
            return None
        return self.weight.t() if self.layout == "out_in" else self.weight

    @weight_t.setter
    def weight_t(self, t: torch.Tensor | None) -> None:
        if t is None:
            self.weight = None
        else:
            self.weight = (t.t() if self.layout == "out_in" else t).contiguous()

    @property
    def in_features(self) -> int:
        return int(self.q.in_features if self.q is not None else self.weight_t.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.q is not None:
            if isinstance(self.q, INT4_TYPES):
                return int4_matmul(x, self.q)
            if (self.ops is not None and cpu_kernels.eligible(x, cpu_kernels.MAX_BATCH_INT8)
                    and self.q.qweight.device.type == "cpu"):
                return cpu_kernels.gemv_int8(self.ops, x, self.q.qweight, self.q.scales, self.q.in_features)
            return int8_matmul(x, self.q)
        if self.layout == "out_in":
            w = self.weight
            if cpu_kernels.eligible(x) and cpu_kernels.f32_kernel_wins(x.shape[0], w.numel() * w.element_size()):
                return cpu_kernels.gemv_f32(self.ops, x, self.weight)
            return onednn.linear(x, self.weight)
        return x @ self.weight

    def nbytes(self) -> int:
        if self.q is not None:
            return self.q.nbytes()
        return self.weight.numel() * self.weight.element_size()

    def out_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Rows ``idx`` [T] of the full-precision [out, in] weight → [T, in] (the tied embedding
        lookup), gathered without copying the whole weight in either layout."""
        if self.layout == "out_in":
            return self.weight.index_select(0, idx)
        return self.weight.index_select(1, idx).t()

    def quantize_(self) -> torch.Tensor:
        """Switch to int8; returns the full-precision [in, out] tensor (now owned by the caller)."""
        if self.q is not None:
            raise RuntimeError("Linear is already quantized")
        full = self.weight_t
        self.q = quantize_per_channel(full.t())
        self.weight = None
        return full

    def restore_(self, weight_t: torch.Tensor) -> None:
        """Switch back to full precision with the exact tensor ``quantize_`` returned."""
        self.weight_t = weight_t
        self.q = None


def rope_inv_freq(head_dim: int, theta: float, args: ModelArgs | None = None,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """RoPE inverse frequencies [D/2] float32: ``theta^(-2i/D)``, scaled per ``args.rope_scaling_type``.

    "linear": all / factor. "llama3" (transformers ``_compute_llama3_parameters``, Meta's
    Llama 3.1 reference): wavelength ``2π/f``; above ``original_max / low_freq_factor`` → f /
    factor; below ``original_max / high_freq_factor`` → f; between, the mix ``(1-s)·f/factor +
    s·f`` with ``s = (original_max/wavelen - low) / (high - low)``.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    kind = args.rope_scaling_type if args is not None else None
    if kind == "linear":
        return inv_freq / args.rope_scaling_factor
    if kind == "llama3":
        factor, low, high = args.rope_scaling_factor, args.rope_low_freq_factor, args.rope_high_freq_factor
        old = args.rope_original_max_seq_len
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return inv_freq


def _rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                  args: ModelArgs | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 1, D/2] float32 of angle ``pos · inv_freq`` (:func:`rope_inv_freq`; llama2.c run.c,
    HF LlamaRotaryEmbedding)."""
    inv_freq = rope_inv_freq(head_dim, theta, args, positions.device)
    ang = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """Rotate x [T, heads, D] by angles (cos/sin [T, 1, D/2]) in the given pair layout."""
    if style == "interleaved":
        xp = x.unflatten(-1, (-1, 2))
        x0, x1 = xp[..., 0], xp[..., 1]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2).to(x.dtype)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def rope_tables(cos: torch.Tensor, sin: torch.Tensor, style: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-width tables [T, 1, D] for :func:`apply_rope_tables` from cos/sin [T, 1, D/2]: the
    cosine of each lane and the sine signed for the lane's partner (built once per step)."""
    if style == "interleaved":
        return cos.repeat_interleave(2, dim=-1), torch.stack((-sin, sin), dim=-1).flatten(-2)
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def apply_rope_tables(x: torch.Tensor, cos_full: torch.Tensor, sin_signed: torch.Tensor, style: str) -> torch.Tensor:
    """:func:`apply_rope` in 4 ops: ``x · cos + partner(x) · ±sin`` where ``partner`` swaps each
    rotated pair ((0,1),(2,3)… interleaved, (i, i+D/2) half). Bit-identical to ``apply_rope``:
    ``a - b`` is ``a + (-b)`` exactly in IEEE arithmetic and each lane adds the same two
    products (addition commutes)."""
    if style == "interleaved":
        partner = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    else:
        partner = x.roll(x.shape[-1] // 2, dims=-1)
    out = x * cos_full + partner * sin_signed
    return out if out.dtype == x.dtype else out.to(x.dtype)


def cpu_bf16_supported(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bfloat16 matmuls natively (``avx512_bf16`` or ``amx_bf16`` in
    ``/proc/cpuinfo``'s flags; ``cpuinfo`` overrides the file's text, for tests).

    Without them oneDNN emulates bf16 through fp32 conversions: measured on an AVX2-only EPYC
    (torch 2.13), a bf16 linear ran 1.3–8× slower than fp32 (384×2048 batch 32: 6.3 ms vs 2.2 ms),
    so ``--dtype bfloat16`` on such a CPU is correct but slow. False when the file is unreadable.
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                cpuinfo = fh.read()
        except OSError:
            return False
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    return bool(flags & {"avx512_bf16", "amx_bf16"})


class Block(torch.nn.Module):
    """One decoder layer: fused QKV, paged attention, output projection, SwiGLU."""

    def __init__(self, args: ModelArgs, w: dict[str, torch.Tensor], i: int):
        super().__init__()
        p = f"layers.{i}."
        self.attention_norm = w[p + "attention_norm.weight"]
        self.ffn_norm = w[p + "ffn_norm.weight"]
        self.wqkv = Linear(torch.cat([w[p + "attention.wq.weight"], w[p + "attention.wk.weight"],
                                      w[p + "attention.wv.weight"]], dim=0))
        self.wo = Linear(w[p + "attention.wo.weight"])
        self.w13 = Linear(torch.cat([w[p + "feed_forward.w1.weight"], w[p + "feed_forward.w3.weight"]], dim=0))
        self.w2 = Linear(w[p + "feed_forward.w2.weight"])


class LlamaModel(torch.nn.Module):
    """Llama decoder; see the module docstring for the weight layout.

    ``forward(input_ids [T] long, positions [T] long, kv_cache, meta) → float32 logits [N, vocab]``
    with ``N = len(meta.logits_indices)``. ``precision`` is "full" or "int8".
    ``attn_impl``: "sdpa" on CUDA, "matmul" elsewhere (engine.attention.paged_attention).
    """

    def __init__(self, args: ModelArgs, weights: dict[str, torch.Tensor],
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        super().__init__()
        expected = canonical_weight_names(args)
        missing = [n for n in expected if n not in weights]
        if missing:
            raise ValueError(f"missing weights: {missing[:5]}{' …' if len(missing) > 5 else ''}")
        for n, shape in expected.items():
            if tuple(weights[n].shape) != shape:
                raise ValueError(f"weight {n} has shape {tuple(weights[n].shape)}, expected {shape}")
        self.args = args
        self.device = torch.device(device)
        self.dtype = dtype
        w = {n: weights[n].detach().to(device=self.device, dtype=dtype) for n in expected}
        self.layers = torch.nn.ModuleList(Block(args, w, i) for i in range(args.n_layers))
        self.norm = w["norm.weight"]
        self.output = Linear(w["output.weight"] if not args.tie_embeddings else w["tok_embeddings.weight"])
        # Untied: a separate [vocab, dim] table (rows gathered). Tied: columns of output.weight_t.
        self.tok_embeddings: torch.Tensor | None = (
            None if args.tie_embeddings else w["tok_embeddings.weight"].contiguous())
        self.tok_embeddings_q: Int8Weight | None = None
        self.precision: str = "full"
        self._host_backup: dict[str, torch.Tensor] = {}
        self.attn_impl = "sdpa" if self.device.type == "cuda" else "matmul"
        self.scale = args.head_dim ** -0.5
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None   # see rope_at
        #: engine.cpu_kernels ops for the fused RMSNorm / SiLU·up (None: plain torch)
        self.kernel_ops = cpu_kernels.ops_for(self.device, dtype)

    # ---- precision ------------------------------------------------------------------
    def _linears(self) -> dict[str, Linear]:
        out = {"output": self.output}
        for i, blk in enumerate(self.layers):
            out[f"layers.{i}.wqkv"] = blk.wqkv
            out[f"layers.{i}.wo"] = blk.wo
            out[f"layers.{i}.w13"] = blk.w13
            out[f"layers.{i}.w2"] = blk.w2
        return out

    def set_precision(self, mode: Literal["full", "int8"]) -> None:
        """Switch all linear weights (and an untied embedding table) between full and int8.

        int8: each weight is quantized per output channel (engine.quant), its full-precision
        tensor leaves the device: on CUDA it is copied to host memory and the device tensor
        freed; on CPU the same tensor is kept as the host backup (it no longer counts in
        ``weight_bytes``, which reports only what the model computes with). full: the backup
        is put back unchanged, so logits are bit-identical to before the switch. Norm weights
        stay in full precision. Idempotent. Raises ValueError for an unknown mode.
        """
        if mode not in PRECISIONS:
            raise ValueError(f"precision mode must be one of {PRECISIONS}, got {mode!r}")
        if mode == self.precision:
            return
        self.__dict__.pop("_embed_np", None)   # embed's numpy views of the old int8 rows: not kept alive
        fused_decode.weights_changed()   # the fused op's plan holds the embedding rows too (an untied table)
        if "int4" in (mode, self.precision):  # start-time only, no way back (engine.quant_int4)
            int4_weights(self, getattr(self, "q4_sources", None), self.precision)
            self.q4_sources, self.precision = None, "int4"
            return
        if mode == "int8":
            backup: dict[str, torch.Tensor] = {}
            for name, lin in self._linears().items():
                full = lin.quantize_()
                backup[name] = full if full.device.type == "cpu" else full.to("cpu")
                del full
            if self.tok_embeddings is not None:
                emb = self.tok_embeddings
                self.tok_embeddings_q = quantize_per_channel(emb)
                backup["tok_embeddings"] = emb if emb.device.type == "cpu" else emb.to("cpu")
                self.tok_embeddings = None
                del emb
            self._host_backup = backup
            self.precision = "int8"
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        else:
            backup = self._host_backup
            for name, lin in self._linears().items():
                lin.restore_(backup[name].to(self.device))
            if "tok_embeddings" in backup:
                self.tok_embeddings = backup["tok_embeddings"].to(self.device)
                self.tok_embeddings_q = None
            self._host_backup = {}
            self.precision = "full"

    def weight_bytes(self) -> int:
        """Bytes of weights the model computes with in the current precision (device-resident
        on CUDA); the host rollback copy held in int8 mode is not counted (see host_backup_bytes)."""
        n = sum(lin.nbytes() for lin in self._linears().values())
        n += sum(t.numel() * t.element_size() for blk in self.layers for t in (blk.attention_norm, blk.ffn_norm))
        n += self.norm.numel() * self.norm.element_size()
        if self.tok_embeddings is not None:
            n += self.tok_embeddings.numel() * self.tok_embeddings.element_size()
        if self.tok_embeddings_q is not None:
            n += self.tok_embeddings_q.nbytes()
        return n

    def host_backup_bytes(self) -> int:
        """Bytes of the full-precision rollback copy held in host memory (0 in full mode)."""
        return sum(t.numel() * t.element_size() for t in self._host_backup.values())

    def weight_bytes_by_mode(self) -> dict[str, int]:
        """Weight bytes of each precision, whatever the current one: {"full": b, "int8": b}.

        int8 = 1 byte per quantized weight (inner dim padded to 16) + 4 bytes (float32 scale)
        + 2 bytes (bf16 unit scale for the CPU kernel) per output channel.
        """
        a = self.args
        elem = torch.empty((), dtype=self.dtype).element_size()
        norms = (2 * a.n_layers + 1) * a.dim * elem
        mats = [(a.vocab_size, a.dim)] * (1 if a.tie_embeddings else 2)
        qkv_out = (a.n_heads + 2 * a.n_kv_heads) * a.head_dim
        mats += [(qkv_out, a.dim), (a.dim, a.n_heads * a.head_dim), (2 * a.hidden_dim, a.dim),
                 (a.dim, a.hidden_dim)] * a.n_layers
        full = norms + sum(o * i for o, i in mats) * elem
        int8 = norms + sum(int8_weight_nbytes(o, i) for o, i in mats)
        int4 = norms + int4_mode_nbytes(mats, 1 if a.tie_embeddings else 2, self.device)  # engine.quant_int4
        return {"full": full, "int8": int8, "int4": int4}

    # ---- weights out (conversion) -----------------------------------------------------
    def export_weights(self) -> dict[str, torch.Tensor]:
        """The full-precision canonical weights (CPU tensors, [out, in]), in any precision mode."""
        if self.precision == "int4":
            raise ValueError("export_weights: an int4 model holds no full-precision weights")
        a = self.args
        D, H, Hkv = a.head_dim, a.n_heads, a.n_kv_heads

        def full_t(name: str, lin: Linear) -> torch.Tensor:
            t = lin.weight_t if lin.q is None else self._host_backup[name]
            return t.t().contiguous().to("cpu")

        out: dict[str, torch.Tensor] = {"norm.weight": self.norm.to("cpu").clone()}
        cls = full_t("output", self.output)
        if a.tie_embeddings:
            out["tok_embeddings.weight"] = cls
        else:
            out["output.weight"] = cls
            emb = self.tok_embeddings if self.tok_embeddings is not None else self._host_backup["tok_embeddings"]
            out["tok_embeddings.weight"] = emb.to("cpu").clone()
        for i, blk in enumerate(self.layers):
            p = f"layers.{i}."
            qkv = full_t(f"layers.{i}.wqkv", blk.wqkv)
            out[p + "attention.wq.weight"] = qkv[: H * D].contiguous()
            out[p + "attention.wk.weight"] = qkv[H * D:(H + Hkv) * D].contiguous()
            out[p + "attention.wv.weight"] = qkv[(H + Hkv) * D:].contiguous()
            out[p + "attention.wo.weight"] = full_t(f"layers.{i}.wo", blk.wo)
            w13 = full_t(f"layers.{i}.w13", blk.w13)
            out[p + "feed_forward.w1.weight"] = w13[: a.hidden_dim].contiguous()
            out[p + "feed_forward.w3.weight"] = w13[a.hidden_dim:].contiguous()
            out[p + "feed_forward.w2.weight"] = full_t(f"layers.{i}.w2", blk.w2)
            out[p + "attention_norm.weight"] = blk.attention_norm.to("cpu").clone()
            out[p + "ffn_norm.weight"] = blk.ffn_norm.to("cpu").clone()
        return out

    # ---- forward ----------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [T, dim] in the model dtype."""
        if self.tok_embeddings is not None:
            return self.tok_embeddings.index_select(0, input_ids)
        q = self.tok_embeddings_q if self.tok_embeddings_q is not None else self.output.q  # tied: the classifier's rows
        if q is not None:
            # int8 rows times their scales: the same float32 products as converting the rows first
            # (an int8 → float32 conversion is exact), in 1–2 ops instead of 5; one token on CPU reads
            # the row through cached numpy views (~4 µs vs ~21 µs, tests/unit/test_model_quant.py)
            if input_ids.shape[0] == 1 and q.qweight.device.type == "cpu" and self.dtype == torch.float32:
                c = self.__dict__.get("_embed_np")
                if c is None or c[0] is not q:
                    c = self.__dict__["_embed_np"] = (q, q.qweight.numpy()[:, : q.in_features],
                                                      q.scales.numpy()[:, None])
                i = int(input_ids)
                if 0 <= i < c[1].shape[0]:   # else index_select below raises, as before
                    return torch.from_numpy(c[1][i:i + 1] * c[2][i:i + 1])
            rows = q.qweight.index_select(0, input_ids)[:, : q.in_features]
            return torch.mul(rows, q.scales.index_select(0, input_ids).unsqueeze(1)).to(self.dtype)
        return self.output.out_rows(input_ids)

    def rope_table(self, num_positions: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The :func:`rope_tables` of positions ``0 … n-1`` on ``device``: ``(cos_full, sin_signed)``
        [n, 1, D] float32, contiguous, built once (n: a power of two >= ``num_positions``, at least 256;
        rebuilt twice as large when a longer context comes, so it never holds more than twice the
        longest context seen). Its rows are bit-identical to computing the angles of a step's positions
        (the same elementwise float32 ops; checked by a unit test)."""
        tab = self._rope_table
        if tab is None or tab[0].shape[0] < num_positions or tab[0].device != device:
            a = self.args
            n = max(256, 1 << max(0, num_positions - 1).bit_length())
            tab = rope_tables(*_rope_cos_sin(torch.arange(n, device=device), a.head_dim, a.rope_theta, a),
                              a.rope_style)
            self._rope_table = tab
        return tab

    def rope_at(self, positions: torch.Tensor, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The :meth:`rope_table` rows of ``positions`` [T] (each < ``num_positions``):
        ``(cos_full, sin_signed)`` [T, 1, D], two ``index_select``. Raises IndexError (from torch)
        for a position >= the table's length."""
        tab = self.rope_table(num_positions, positions.device)
        return tab[0].index_select(0, positions), tab[1].index_select(0, positions)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache,
                meta: AttentionMetadata, inputs_embeds: torch.Tensor | None = None,
                greedy_out: torch.Tensor | None = None) -> torch.Tensor:
        """Run one packed step; see the class docstring. ``inputs_embeds`` [T, dim] (optional)
        replaces the token embeddings of ``input_ids`` (long-text memory compression feeds a
        vector there). ``greedy_out`` (optional, float64 [2T], contiguous): when the step runs
        fused with the output head in the op (its logits come from the op), the op also writes each
        row's greedy ``(token, logprob)`` into it (``fused_decode.decode_layers``); otherwise it is
        left untouched (the caller tells by a sentinel it wrote first). Raises ValueError on
        mismatched shapes."""
        a = self.args
        T = input_ids.shape[0]
        if positions.shape[0] != T or meta.slot_mapping.shape[0] != T:
            raise ValueError(f"input_ids ({T}), positions ({positions.shape[0]}) and slot_mapping "
                             f"({meta.slot_mapping.shape[0]}) must have the same length")
        if kv_cache.n_layers != a.n_layers:
            raise ValueError(f"kv_cache has {kv_cache.n_layers} layers, model has {a.n_layers}")
        H, Hkv, D = a.n_heads, a.n_kv_heads, a.head_dim
        meta.prepare(kv_cache.block_size)
        eps = a.norm_eps
        fused = fused_decode.layer_weights(self, kv_cache, meta, T)   # None: the per-op path below
        emb = None if fused is None or inputs_embeds is not None else fused_decode.embed_tensors(self)
        head = None if fused is None else fused_decode.head_tensors(self)   # not None: the op returns the logits
        if emb is not None:   # the op reads the embedding and RoPE rows of the ids and positions itself
            x = fused_decode.decode_tokens(self, fused, input_ids, positions, emb,
                                           self.rope_table(meta.max_context, positions.device), kv_cache, meta, head,
                                           None if head is None else greedy_out)
        else:
            cos, sin = self.rope_at(positions, meta.max_context)
            x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds.to(self.dtype)
            if fused is not None:
                x = fused_decode.decode_layers(self, fused, x, cos, sin, kv_cache, meta, head,
                                               None if head is None else greedy_out)
        if head is not None:
            return x
        for li, blk in enumerate(self.layers if fused is None else ()):
            h = cpu_kernels.rms_norm(self.kernel_ops, x, blk.attention_norm, eps)
            qkv = blk.wqkv(h)
            qk = apply_rope_tables(qkv[:, : (H + Hkv) * D].view(T, H + Hkv, D), cos, sin, a.rope_style)
            q = qk[:, :H]
            k = qk[:, H:]
            v = qkv[:, (H + Hkv) * D:].view(T, Hkv, D)
            kv_cache.write(li, meta.slot_mapping, k, v)
            o = paged_attention(q, kv_cache, li, meta, self.scale, self.attn_impl, self.kernel_ops)
            x = x + blk.wo(o.reshape(T, H * D))
            h = cpu_kernels.rms_norm(self.kernel_ops, x, blk.ffn_norm, eps)
            gu = blk.w13(h)
            x = x + blk.w2(cpu_kernels.silu_mul(self.kernel_ops, gu))
        if meta.logits_indices.shape[0] != T:
            x = x.index_select(0, meta.logits_indices)
        x = cpu_kernels.rms_norm(self.kernel_ops, x, self.norm, eps)
        return self.output(x).float()
