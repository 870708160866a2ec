"""EngineConfig: every limit of the engine is configuration (nothing hard-coded).

Names follow vLLM's ``EngineArgs`` (``max_model_len``, ``max_num_seqs``,
``max_num_batched_tokens``, ``block_size``, ``gpu_memory_utilization``, ``kv_cache_dtype``).
Validation happens in ``__post_init__`` and raises :class:`ConfigError` naming the field and
the limit. Values that depend on the model (``max_model_len``) or on the machine (``device``,
``dtype``) are resolved by :meth:`EngineConfig.resolve`, which returns a new config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from inferctl.contract.oom import DEFAULT_OOM_ERROR_CODES  # noqa: F401 - re-exported (the default of oom_error_codes)
from inferctl.engine.spec_decode.config import SpeculativeConfigError, parse_speculative_config

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


class ConfigError(ValueError):
    """An invalid engine setting. ``field`` names the setting; the message states the limit."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass
class EngineConfig:
    """Settings of one engine instance.

    Attributes:
        max_model_len: longest sequence (prompt + generated tokens) admitted. ``None`` = the
            model's own maximum (``ModelArgs.max_seq_len``: llama2.c ``seq_len``, HF
            ``max_position_embeddings``, GGUF ``context_length``); above it :meth:`resolve` raises
            unless ``allow_long_max_model_len``.
        allow_long_max_model_len: accept a ``max_model_len`` above the model's maximum (vLLM's
            ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``; CLI ``--allow-long-max-model-len`` or
            ``INFERCTL_ALLOW_LONG_MAX_MODEL_LEN=1``). RoPE is computed for any position, but output
            past the trained length degrades (docs/longtext.md run D).
        max_num_seqs: most sequences in the running queue (one batch).
        max_num_batched_tokens: per-step token budget (prefill chunks + decodes), vLLM's name.
        block_size: tokens per KV cache block.
        num_kv_blocks: KV pool size in blocks; ``None`` = derived from the memory budget.
        memory_budget_bytes: device memory the engine accounts against (CPU: ``--memory-budget``).
            ``None`` on CUDA = ``gpu_memory_utilization`` x total device memory; ``None`` on CPU =
            exactly what the weights, the KV pool and the worst-case step need (never refuses).
        gpu_memory_utilization: fraction of the CUDA device used when no budget is given (0..1].
        cpu_kv_cache_bytes: cap on the KV pool on CPU when neither ``num_kv_blocks`` nor a
            budget is given (like vLLM's ``VLLM_CPU_KVCACHE_SPACE``).
        kv_cache_dtype: ``"auto"`` (same as the model dtype) or ``"int8"`` (int8 K/V with
            per-token-head float32 scales).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when available).
        dtype: model dtype: ``"auto"`` (float32 on CPU, bfloat16 on CUDA when supported,
            else float16), ``"float32"``, ``"bfloat16"``, ``"float16"``.
        oom_error_codes: CUDA error codes handled as out-of-memory. Default {2, 800}: the
            product's design notes call the OOM "Error 800"; CUDA itself names 800
            ``cudaErrorNotPermitted`` and 2 ``cudaErrorMemoryAllocation`` — both configurable.
        max_oom_retries: how many times the request blamed for an OOM is re-queued before it
            fails with finish_reason ``"error"``.
        oom_backoff_seconds / oom_backoff_max_seconds: delay before the retry after an
            "exhaustion" OOM: ``min(max, base * 2**(retry-1))``.
        repetition_stop_default: stop generation on a repetition loop when the request does
            not say (``SamplingParams.repetition_stop`` None); a request's true/false wins
            (``--repetition-stop``).
        enable_prefix_caching: reuse the KV blocks of full-block token prefixes across
            requests (vLLM's automatic prefix caching, :mod:`inferctl.engine.prefix_cache`).
        repetition_stop_max_ngram / repetition_stop_min_repeats / repetition_stop_min_span:
            the loop detector's settings (``quality.detect_repetition_loop``: the output's tail
            is a loop when its last n tokens, n <= max_ngram, repeat back to back at least
            ``max(min_repeats, ceil(min_span / n))`` times).
        num_threads: torch intra-op CPU threads, set when the engine starts
            (``torch.set_num_threads``, process-wide); ``None`` = leave torch's setting. Tiny
            models run faster with 1 thread (per-op thread sync costs more than the math).
        served_model_name: the ``model`` label and name in ``/stats``; ``None`` = bundle name.
        speculative_config: speculative decoding (vLLM's ``--speculative-config``): None = off,
            else the JSON text, a dict or a ``SpeculativeConfig``; validated into a
            ``SpeculativeConfig`` (:mod:`inferctl.engine.spec_decode.config`).
        recent_requests: finished requests kept in ``/stats`` ``requests.recent``.
        latency_window: latency samples kept for the ``/stats`` quantiles.
        recent_faults: faults kept in ``/stats`` ``faults.recent``.
    """

    max_model_len: int | None = None
    allow_long_max_model_len: bool = False
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None
    memory_budget_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    cpu_kv_cache_bytes: int = 128 << 20
    kv_cache_dtype: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    oom_error_codes: frozenset[int] = field(default_factory=lambda: DEFAULT_OOM_ERROR_CODES)
    max_oom_retries: int = 3
    oom_backoff_seconds: float = 0.05
    oom_backoff_max_seconds: float = 2.0
    repetition_stop_default: bool = False
    enable_prefix_caching: bool = True
    repetition_stop_max_ngram: int = 32
    repetition_stop_min_repeats: int = 4
    repetition_stop_min_span: int = 16
    served_model_name: str | None = None
    num_threads: int | None = None
    recent_requests: int = 64
    latency_window: int = 4096
    recent_faults: int = 32
    speculative_config: object = None

    def __post_init__(self) -> None:
        self.oom_error_codes = frozenset(int(c) for c in self.oom_error_codes)
        self._check_int("max_num_seqs", 1)
        self._check_int("max_num_batched_tokens", 1)
        self._check_int("block_size", 1)
        self._check_int("cpu_kv_cache_bytes", 1)
        self._check_int("max_oom_retries", 0)
        self._check_int("repetition_stop_max_ngram", 1)
        self._check_int("repetition_stop_min_repeats", 2)
        self._check_int("repetition_stop_min_span", 1)
        self._check_int("recent_requests", 0)
        self._check_int("latency_window", 1)
        self._check_int("recent_faults", 0)
        try:
            self.speculative_config = parse_speculative_config(self.speculative_config)
        except SpeculativeConfigError as err:
            raise ConfigError(err.field, err.message) from None
        if self.max_model_len is not None:
            self._check_int("max_model_len", 1)
        if not isinstance(self.allow_long_max_model_len, bool):
            raise ConfigError("allow_long_max_model_len",
                              f"must be true or false, got {self.allow_long_max_model_len!r}")
        if self.num_threads is not None:
            self._check_int("num_threads", 1)
        if self.num_kv_blocks is not None:
            self._check_int("num_kv_blocks", 1)
        if self.memory_budget_bytes is not None:
            self._check_int("memory_budget_bytes", 1)
        if not 0.0 < float(self.gpu_memory_utilization) <= 1.0:
            raise ConfigError("gpu_memory_utilization",
                              f"must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_dtype not in ("auto", "int8"):
            raise ConfigError("kv_cache_dtype", f"must be 'auto' or 'int8', got {self.kv_cache_dtype!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError("device", f"must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {self.device!r}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ConfigError("dtype", f"must be 'auto' or one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if any(c < 0 for c in self.oom_error_codes):
            raise ConfigError("oom_error_codes", f"codes must be >= 0, got {sorted(self.oom_error_codes)}")
        for name in ("oom_backoff_seconds", "oom_backoff_max_seconds"):
            if float(getattr(self, name)) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")

    def _check_int(self, name: str, minimum: int) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name, f"must be an integer, got {value!r}")
        if value < minimum:
            raise ConfigError(name, f"must be >= {minimum}, got {value}")

    # ------------------------------------------------------------------ resolution
    def resolve(self, model_max_seq_len: int, model_device: torch.device | str | None = None,
                model_dtype: torch.dtype | None = None) -> "EngineConfig":
        """Return a copy with ``max_model_len``, ``device`` and ``dtype`` made concrete.

        With a loaded model (``model_device`` / ``model_dtype``), ``"auto"`` takes the model's
        device and dtype, and an explicit setting that differs raises :class:`ConfigError`
        (the model is loaded on its device by ``engine.loader``; the engine does not move it).
        Raises :class:`ConfigError` when CUDA is asked for but not available, or ``max_model_len``
        is above ``model_max_seq_len`` (tokens) without ``allow_long_max_model_len``.
        """
        device = self.device
        if model_device is not None:
            mdev = torch.device(model_device)
            mname = "cpu" if mdev.type == "cpu" else str(mdev)
            if device == "auto" or (device == "cuda" and mdev.type == "cuda"):
                device = mname          # "cuda" → the model's "cuda:N": one concrete device everywhere
            elif torch.device(device).type != mdev.type or str(torch.device(device)) != mname:
                raise ConfigError("device", f"{device!r} asked for, but the model was loaded on "
                                  f"{mname!r}; load it with device={device!r}")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError("device", f"{device!r} asked for but torch.cuda.is_available() is False")
        dtype = self.dtype
        if model_dtype is not None:
            mname = next((k for k, v in _DTYPES.items() if v == model_dtype and len(k) > 5),
                         str(model_dtype).replace("torch.", ""))
            if dtype == "auto":
                dtype = mname
            elif _DTYPES.get(dtype) != model_dtype:
                raise ConfigError("dtype", f"{dtype!r} asked for, but the model was loaded in "
                                  f"{mname!r}; load it with that dtype")
        if dtype == "auto":
            if device == "cpu":
                dtype = "float32"
            else:
                dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        max_model_len = self.max_model_len if self.max_model_len is not None else int(model_max_seq_len)
        if max_model_len > int(model_max_seq_len) and not self.allow_long_max_model_len:
            raise ConfigError("max_model_len", f"{max_model_len} is above the model's maximum of {model_max_seq_len} "
                              "tokens (its seq_len / max_position_embeddings / context_length); give at most "
                              f"{model_max_seq_len}, or allow it with --allow-long-max-model-len "
                              "(INFERCTL_ALLOW_LONG_MAX_MODEL_LEN=1): output past the trained length degrades")
        return dataclasses.replace(self, device=device, dtype=dtype, max_model_len=max_model_len)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The model dtype as a ``torch.dtype`` (``"auto"`` must be resolved first)."""
        if self.dtype == "auto":
            raise ConfigError("dtype", "'auto' is resolved by EngineConfig.resolve() first")
        return _DTYPES[self.dtype]
