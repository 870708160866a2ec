"""The engine's CLI commands, attached to ``inferctl`` by the front door ``inferctl/cli.py``.

* ``inferctl engine serve --model PATH ...`` — load the model(s) and serve the
  OpenAI-compatible API (:mod:`engine.server`) with uvicorn on 127.0.0.1:8000 by default.
  ``GET /health`` is liveness, ``GET /ready`` readiness. The first SIGTERM or SIGINT drains:
  ``/ready`` turns 503 ``stopping`` at once, new requests get 503 with ``Retry-After``, in-flight
  requests and streams finish within ``--shutdown-grace-seconds`` (default 30; past it they are
  aborted with an error their clients see), then the process exits 0. A second signal exits at
  once with code 1 (:mod:`inferctl.engine.entrypoints.lifecycle`). The port opens once the
  model is loaded; a signal during the load ends the process before it serves.
* ``inferctl generate --prompt TEXT`` — one completion in-process (no server); prints only
  the completion text to stdout (exactly the text; a newline is added only when stdout is a
  terminal), everything else goes to stderr. With no ``--model`` it uses the built-in demo
  model.

Heavy imports (torch, fastapi, the engine) happen inside the commands, so ``inferctl --help``
stays fast.

Two models: ``--light-model`` serves a second, lighter model beside the main one (its own
LLMEngine with its own KV pool and budget), for the controller's latency breaker
(``/admin/route``). Budgets are separate: ``--memory-budget`` is the main engine's and
``--light-memory-budget`` the light one's. With no budget on CUDA, each engine would take
``gpu_memory_utilization`` of the whole device, so the value is split between the two
(``--light-memory-fraction``, default 0.2 of it for the light model); on CPU an engine with no
budget reserves exactly what it needs.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Optional

import typer

from inferctl.contract import units
from inferctl.contract.hosts import check_bind_host
from inferctl.contract.http import MAX_BODY_BYTES, check_api_key
from inferctl.contract.logs import check_log_level


def parse_size(text: str, name: str = "--memory-budget") -> int:
    """Parse a byte size flag: ``"8000000"``, ``"64MiB"``, ``"1.5GiB"``, ``"500MB"``.

    SI suffixes (K, KB, M, MB, G, GB, T, TB) are powers of 1000, IEC ones (Ki, KiB, Mi, MiB,
    Gi, GiB, Ti, TiB) powers of 1024; case-insensitive (:func:`inferctl.contract.units.parse_size`).
    Returns bytes (int >= 1). Raises typer.BadParameter naming ``name`` for anything else.
    """
    try:
        return units.parse_size(text, name, min_bytes=1)
    except units.SizeError as err:
        raise typer.BadParameter(str(err)) from None


#: ``--allow-long-max-model-len`` of ``engine serve`` and ``generate`` (vLLM: ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``)
AllowLongOpt = typer.Option(False, "--allow-long-max-model-len", envvar="INFERCTL_ALLOW_LONG_MAX_MODEL_LEN",
                            help="Accept a --max-model-len above the model's own maximum (seq_len / "
                                 "max_position_embeddings / context_length); output past it degrades.")


def _die(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


#: Upper bound of ``--num-threads``: a fixed number, not a multiple of this host's cores, so one
#: command line means the same on every host. torch and the kernels start one OpenMP thread each;
#: past the cores they only contend, and far past (32768 threads on a 2-core host) libgomp's
#: thread creation failed and the process died with SIGSEGV (exit 139).
MAX_NUM_THREADS = 1024
#: Upper bound of ``--block-size`` (tokens): the largest block the engine's paged-attention
#: kernels take (``engine.attention.KERNEL_MAX_BLOCK_SIZE``, csrc/paged_attention.h
#: ``MAX_BLOCK_SIZE``: one block's scores per head live on the stack). Above it every step took
#: the slow plain path, and a huge block made one block bigger than memory.
MAX_BLOCK_SIZE = 256


def check_device(device: str, flag: str = "--device") -> str:
    """``device`` lowercased when it is ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (N a device
    index, any case); exits 2 naming ``flag`` otherwise (``tpu`` reached torch and stopped
    the command with a traceback)."""
    import re

    if not re.fullmatch(r"auto|cpu|cuda(:[0-9]{1,4})?", device.lower()):
        _die(f"{flag}: must be auto, cpu, cuda or cuda:N (N a CUDA device index), got {device!r}")
    return device.lower()


def _config(**kwargs):  # noqa: ANN202 - EngineConfig, imported lazily
    from inferctl.engine.config import ConfigError, EngineConfig

    try:
        return EngineConfig(**kwargs)
    except ConfigError as exc:
        _die(str(exc))


def oom_options(max_oom_retries: int, oom_backoff_seconds: float,
                oom_backoff_max_seconds: float) -> dict:
    """The OOM-retry flags of ``engine serve`` as :class:`~engine.config.EngineConfig` fields
    (``max_oom_retries``, ``oom_backoff_seconds``, ``oom_backoff_max_seconds``; seconds).

    Raises ``typer.BadParameter`` naming the flag for a negative or non-integer retry count or
    a negative, NaN or infinite delay (a NaN delay would break the engine's backoff sleep)."""
    if isinstance(max_oom_retries, bool) or not isinstance(max_oom_retries, int) or max_oom_retries < 0:
        raise typer.BadParameter(f"--max-oom-retries: must be an integer >= 0, got {max_oom_retries!r}")
    for flag, value in (("--oom-backoff-seconds", oom_backoff_seconds),
                        ("--oom-backoff-max-seconds", oom_backoff_max_seconds)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < 0:
            raise typer.BadParameter(f"{flag}: must be a finite number of seconds >= 0, got {value!r}")
    return {"max_oom_retries": int(max_oom_retries), "oom_backoff_seconds": float(oom_backoff_seconds),
            "oom_backoff_max_seconds": float(oom_backoff_max_seconds)}


def admin_token_option(token: Optional[str], token_file: Optional[str]) -> Optional[str]:
    """The admin token of ``engine serve``: ``--admin-token`` / ``$INFERCTL_ADMIN_TOKEN`` or
    the content of ``--admin-token-file`` (not both), checked by
    :func:`inferctl.contract.http.check_admin_token` (>= 16 characters, no leading ``-``).
    None (also for an empty ``$INFERCTL_ADMIN_TOKEN``): admin disabled. Exits 2 with an error
    naming the flag otherwise."""
    from inferctl.contract.http import check_admin_token, read_token_file

    token = token or None
    if token is not None and token_file is not None:
        _die("--admin-token-file: give either --admin-token ($INFERCTL_ADMIN_TOKEN) or --admin-token-file, not both")
    try:
        if token_file is not None:
            return check_admin_token(read_token_file(token_file, "--admin-token-file"),
                                     f"--admin-token-file {token_file}")
        if token is not None:
            return check_admin_token(token, "--admin-token (or $INFERCTL_ADMIN_TOKEN)")
    except ValueError as exc:
        _die(str(exc))
    return None


def port_in_use(host: str, port: int) -> bool:
    """True when ``host:port`` cannot be bound now (another process listens there); port 0 (any
    free port) is never in use. Same socket options as uvicorn (``SO_REUSEADDR``). Raises
    ``socket.gaierror`` when ``host`` does not resolve."""
    import socket

    if not port:
        return False
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except socket.gaierror:
        raise
    except OSError:
        return True
    finally:
        sock.close()
    return False


def looks_like_hub_id(model: str) -> bool:
    """True for ``org/name`` (a Hugging Face hub id) that is no local path: one ``/``, no leading
    ``.``, ``/`` or ``~``, nothing there on disk (the engine never downloads)."""
    import re
    from pathlib import Path

    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", model)) and not Path(model).exists() \
        and Path(model).suffix.lower() not in (".bin", ".gguf", ".pt", ".pth", ".safetensors", ".json")


def _load(spec: Optional[str], tokenizer: Optional[str], device: str, dtype: str = "auto",
          name: Optional[str] = None):  # noqa: ANN202
    """Load a model bundle on its device and dtype (the engine uses the model where it is).

    ``device`` auto → CUDA when available, else CPU; ``dtype`` auto → float32 on CPU, bfloat16
    on CUDA when supported, else float16 (``EngineConfig.resolve``'s rule).
    """
    import torch

    from inferctl.engine.loader import load_model

    if spec and spec != "demo" and looks_like_hub_id(spec):
        _die(f"--model: {spec!r} looks like a Hugging Face hub id: hub ids are not downloaded; give a local path"
             " (a llama2.c .bin or a Hugging Face directory)")
    dev = check_device(device)
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev.startswith("cuda") and not torch.cuda.is_available():
        _die(f"--device: {dev!r} asked for but CUDA is not available")
    if dev.startswith("cuda:") and int(dev[5:]) >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        _die(f"--device: {dev!r} asked for but this machine has {count} CUDA device(s) "
             f"(cuda:0 .. cuda:{count - 1})")
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        if dev == "cpu":
            dtype = "float32"
        else:
            dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if dtype not in names:
        _die(f"--dtype: must be auto, float32, bfloat16 or float16, got {dtype!r}")
    if dtype == "bfloat16" and dev == "cpu":
        from inferctl.engine.model import cpu_bf16_supported

        if not cpu_bf16_supported():
            typer.echo("warning: --dtype bfloat16: this CPU has no avx512_bf16/amx_bf16; bf16 matmuls are "
                       "emulated and slower than float32 here (docs/performance.md)", err=True)
    try:
        return load_model(spec, device=dev, dtype=names[dtype], tokenizer_path=tokenizer, name=name)
    except (FileNotFoundError, ValueError) as exc:
        _die(str(exc))


def _speculative_option(text: Optional[str]):  # noqa: ANN202 - SpeculativeConfig | None
    """``--speculative-config`` checked before the model loads (a clear message naming the key)."""
    from inferctl.contract.speculative import SpeculativeConfigError, parse_speculative_config

    try:
        return parse_speculative_config(text)
    except SpeculativeConfigError as exc:
        _die(f"--speculative-config: {exc}")


def _flag_message(msg: str, budget_flag: str = "--memory-budget") -> str:
    """An engine ConfigError's ``field: why`` with the field named as the flag the user typed."""
    msg = msg.replace("memory_budget_bytes:", f"{budget_flag}:", 1)
    field, sep, why = msg.partition(":")
    return (f"--{field.replace('_', '-')}{sep}{why}"
            if field in ("precision", "max_model_len", "num_kv_blocks", "block_size") else msg)


def _build_engine(bundle, config, precision: str, budget_flag: str = "--memory-budget"):  # noqa: ANN001, ANN202
    from inferctl.engine.async_engine import AsyncLLMEngine
    from inferctl.engine.config import ConfigError
    from inferctl.engine.engine import LLMEngine

    try:
        llm = LLMEngine(bundle, config, precision)   # int4: the memory plan counts 4-bit weights
    except (ConfigError, ValueError) as exc:
        # the engine's field name → the flag the user typed
        _die(_flag_message(str(exc), budget_flag))
    return AsyncLLMEngine(llm)


def build_core(spec):  # noqa: ANN001, ANN201 - CoreSpec → AsyncLLMEngine, imported lazily
    """What ``engine serve`` builds for one model, from a :class:`~inferctl.engine.core_process.CoreSpec`
    (in this process, or in the engine core process with ``--core-process``): the same messages and
    exit codes either way."""
    bundle = _load(spec.model, spec.tokenizer, spec.device, spec.dtype)
    name = spec.served_model_name or bundle.name
    if spec.clash is not None and name == spec.clash:
        name = f"{name}-light"
    return _build_engine(bundle, _config(**spec.config, served_model_name=name), spec.precision, spec.budget_flag)


def _start_core(spec, started: list = ()):  # noqa: ANN001, ANN202 - CoreSpec → CoreClient
    """An engine core process built from ``spec`` (``--core-process``); exits with the child's
    code (it printed why) when it could not start, after stopping the cores in ``started``."""
    from inferctl.engine.core_client import CoreClient, CoreStartError

    try:
        return CoreClient(spec)
    except CoreStartError as exc:
        for other in started:
            other.shutdown()
        if exc.exit_code != 2:
            typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None


def serve(
    model_arg: Optional[str] = typer.Argument(None, metavar="MODEL", show_default=False,
                                              help="Model path (same as --model, vLLM style)."),
    model: Optional[str] = typer.Option(None, "--model",
                                        help="llama2.c .bin, Hugging Face directory, or 'demo' (default)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer",
                                            help="Tokenizer file (llama2.c tokenizer.bin) if not beside the model."),
    light_model: Optional[str] = typer.Option(None, "--light-model",
                                              help="A lighter model served beside the main one."),
    light_tokenizer: Optional[str] = typer.Option(None, "--light-tokenizer", help="Tokenizer of the light model."),
    light_name: Optional[str] = typer.Option(None, "--light-served-model-name",
                                             help="Name of the light model (default: its file name)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address (loopback by default)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."),
    memory_budget: Optional[str] = typer.Option(None, "--memory-budget",
                                                help="Main engine's memory budget: bytes or 512MiB, 1GiB, ..."),
    light_memory_budget: Optional[str] = typer.Option(None, "--light-memory-budget",
                                                      help="Light engine's memory budget."),
    light_memory_fraction: float = typer.Option(0.2, "--light-memory-fraction", min=0.01, max=0.99,
                                                help="Share of gpu_memory_utilization for the light model "
                                                     "when no budgets are given on CUDA."),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", min=0.01, max=1.0),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=1),
    allow_long_max_model_len: bool = AllowLongOpt,
    max_num_seqs: int = typer.Option(64, "--max-num-seqs", min=1),
    num_threads: Optional[int] = typer.Option(
        None, "--num-threads", min=1, help="CPU threads of torch and the engine's kernels (torch.set_num_threads, "
        "process-wide). Default: torch's ($OMP_NUM_THREADS, else the cores), 1 for models under 16 MiB. Engines "
        "sharing a machine: give each its share of the cores (a busy core stalls every multi-threaded step). "
        f"At most {MAX_NUM_THREADS}, a fixed bound on every host: threads past the cores only contend, and tens "
        "of thousands crashed the process."),
    max_num_batched_tokens: int = typer.Option(2048, "--max-num-batched-tokens", min=1),
    block_size: int = typer.Option(16, "--block-size", min=1,
                                   help=f"Tokens per KV cache block, 1..{MAX_BLOCK_SIZE} (the largest block the "
                                        "paged-attention kernels take)."),
    num_kv_blocks: Optional[int] = typer.Option(None, "--num-kv-blocks", min=1,
                                                help="KV cache blocks (default: what the memory budget leaves); "
                                                     "the pool must fit in the device's free memory."),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="auto | int8"),
    precision: str = typer.Option("full", "--precision", help=(
        "Initial precision: full | int8 | int4 (int4: start-only, CPU; GGUF Q4_0/Q4_1 weights kept 4-bit, "
        "others quantized group-32)")),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N"),
    dtype: str = typer.Option("auto", "--dtype", help="auto | float32 | bfloat16 | float16"),
    admin_token: Optional[str] = typer.Option(None, "--admin-token", envvar="INFERCTL_ADMIN_TOKEN",
                                              help="Bearer token for /admin/* (>= 16 characters); none = admin "
                                                   "disabled. A flag's value is visible to every user in `ps`: "
                                                   "prefer $INFERCTL_ADMIN_TOKEN or --admin-token-file."),
    admin_token_file: Optional[str] = typer.Option(None, "--admin-token-file",
                                                   help="Read the /admin/* bearer token from this file "
                                                        "(its first line; not visible in `ps`)."),
    allowed_host: list[str] = typer.Option([], "--allowed-host",
                                           help="Accept this Host header name (repeatable; '*.example.com' for "
                                                "subdomains). Bound to loopback, only localhost/127.0.0.1/[::1] "
                                                "are accepted otherwise (DNS rebinding guard); bound elsewhere, "
                                                "any name is accepted unless some are listed."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name",
                                                    help="Name clients send as 'model' (default: the model's name)."),
    chat_template: Optional[str] = typer.Option(
        None, "--chat-template", help="Jinja chat template: a file path or the template text (vLLM's flag), or "
                                      "plain | roles. Default: the model's own template (GGUF metadata), else plain."),
    max_body_bytes: str = typer.Option("4MiB", "--max-body-bytes",
                                       help="Largest request body (413 above); at most 1GiB."),
    max_oom_retries: int = typer.Option(3, "--max-oom-retries",
                                        help="Times the request blamed for an OOM is re-queued before it fails "
                                             "(503, retry later)."),
    oom_backoff_seconds: float = typer.Option(0.05, "--oom-backoff-seconds",
                                              help="Delay before the retry after an exhaustion OOM: "
                                                   "base * 2**(retry-1) seconds ..."),
    oom_backoff_max_seconds: float = typer.Option(2.0, "--oom-backoff-max-seconds",
                                                  help="... capped at this many seconds."),
    shutdown_grace_seconds: float = typer.Option(30.0, "--shutdown-grace-seconds",
                                                 help="After SIGTERM/SIGINT, seconds in-flight requests get to "
                                                      "finish before they are aborted (then exit 0)."),
    log_level: str = typer.Option("info", "--log-level", help="debug | info | warning | error | critical "
                                                                 "(any case)."),
    log_format: str = typer.Option("text", "--log-format",
                                   help="text | json (one JSON object per line; a /v1 request's line carries its "
                                        "X-Request-Id as request_id)."),
    enable_prefix_caching: bool = typer.Option(True, "--enable-prefix-caching/--no-enable-prefix-caching",
                                               help="Reuse the KV blocks of shared prompt prefixes across "
                                                    "requests (vLLM's automatic prefix caching; on by default)."),
    repetition_stop: bool = typer.Option(False, "--repetition-stop/--no-repetition-stop",
                                         help="Server default of the per-request repetition_stop (end a looping "
                                              "output with finish_reason 'repetition'); a request's value wins."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="INFERCTL_API_KEY",
                                          help="Require 'Authorization: Bearer <key>' on /v1/* (401 otherwise); "
                                               "/health, /ready, /metrics, /stats stay open. Prefer "
                                               "$INFERCTL_API_KEY (a flag is visible in `ps`)."),
    access_log: bool = typer.Option(True, "--access-log/--no-access-log",
                                    help="Log every HTTP request (uvicorn's access log)."),
    speculative_config: Optional[str] = typer.Option(
        None, "--speculative-config", metavar="JSON", help="Speculative decoding of the main model, vLLM's JSON: "
        '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\'; methods ngram, '
        "draft_model (with \"model\": PATH), int8_self (docs/speculative-decoding.md)."),
    core_process: bool = typer.Option(
        False, "--core-process/--no-core-process",
        help="Run each engine core (scheduler, model runner, detokenizer, command mailbox) in a child process "
             "and the HTTP server in this one, as vLLM V1 does: the server's per-token work no longer waits for "
             "the stepping thread's GIL. Experimental (off by default: no throughput gain "
             "measured on a 2-core host); a dead or silent core stops the server (exit 1) for a restart: "
             "docs/architecture.md, 'Engine core process'."),
) -> None:
    ("Serve the OpenAI-compatible API (/v1/completions, /v1/chat/completions) "
     "with /health, /stats, /metrics, /admin.")
    import uvicorn

    from inferctl.contract.logs import configure_logging
    from inferctl.engine.chat_template import resolve_chat_template
    from inferctl.engine.core_process import CoreSpec, model_info
    from inferctl.engine.entrypoints.lifecycle import DEFAULT_FLUSH_SECONDS, GracefulServer
    from inferctl.engine.server import create_app

    if model_arg is not None and model is not None and model_arg != model:
        _die(f"--model: the model is given twice ({model_arg!r} as MODEL and {model!r} as --model); give one")
    model = model if model is not None else model_arg
    device = check_device(device)
    try:
        log_level = check_log_level(log_level)     # contract/logs.py, as the router's
    except ValueError as exc:
        _die(str(exc))
    if num_threads is not None and num_threads > MAX_NUM_THREADS:
        _die(f"--num-threads: must be at most {MAX_NUM_THREADS}, got {num_threads} (threads past the cores "
             "only contend; give the cores this engine may use)")
    if block_size > MAX_BLOCK_SIZE:
        _die(f"--block-size: must be at most {MAX_BLOCK_SIZE} tokens (the largest block the paged-attention "
             f"kernels take), got {block_size}")
    try:
        check_bind_host(host)   # before the port check: "port 8000 is in use on bad host!" misled
        in_use = port_in_use(host, port)
    except ValueError as exc:
        _die(str(exc))
    except OSError as exc:   # socket.gaierror: the name does not resolve
        _die(f"--host: {host!r} does not resolve ({exc.strerror or exc})")
    if in_use:
        _die(f"port {port} (engine) is in use on {host}; choose another with --port N")
    if kv_cache_dtype not in ("auto", "int8"):
        _die(f"--kv-cache-dtype: must be auto or int8, got {kv_cache_dtype!r}")
    if precision not in ("full", "int8", "int4"):
        _die(f"--precision: must be full, int8 or int4, got {precision!r}")
    if chat_template is not None:   # a bad template fails before the model loads
        try:
            resolve_chat_template(chat_template)
        except ValueError as exc:
            _die(str(exc))
    spec = _speculative_option(speculative_config)
    try:
        configure_logging(log_format, log_level)   # contract/logs.py, as the router's
    except ValueError as exc:
        _die(str(exc))
    budget = parse_size(memory_budget) if memory_budget else None
    light_budget = parse_size(light_memory_budget, "--light-memory-budget") if light_memory_budget else None
    body_limit = parse_size(max_body_bytes, "--max-body-bytes")
    if body_limit > MAX_BODY_BYTES:
        _die(f"--max-body-bytes: must be at most {MAX_BODY_BYTES} bytes (1 GiB), got {body_limit}")
    admin_token = admin_token_option(admin_token, admin_token_file)
    if api_key is not None:   # click drops an empty $INFERCTL_API_KEY; an explicit --api-key "" lands here
        try:
            check_api_key(api_key, "--api-key (or $INFERCTL_API_KEY)")
        except ValueError as exc:
            _die(str(exc))
    try:
        oom = oom_options(max_oom_retries, oom_backoff_seconds, oom_backoff_max_seconds)
    except typer.BadParameter as exc:
        _die(str(exc))
    if not math.isfinite(shutdown_grace_seconds) or shutdown_grace_seconds < 0:
        _die(f"--shutdown-grace-seconds: must be a finite number of seconds >= 0, got {shutdown_grace_seconds!r}")

    main_util, light_util = gpu_memory_utilization, gpu_memory_utilization
    if light_model and budget is None and light_budget is None:
        main_util = gpu_memory_utilization * (1.0 - light_memory_fraction)
        light_util = gpu_memory_utilization * light_memory_fraction

    common = dict(max_model_len=max_model_len, allow_long_max_model_len=allow_long_max_model_len,
                  max_num_seqs=max_num_seqs, num_threads=num_threads,
                  max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
                  kv_cache_dtype=kv_cache_dtype, enable_prefix_caching=enable_prefix_caching,
                  repetition_stop_default=repetition_stop, **oom)
    main_config = dict(**common, num_kv_blocks=num_kv_blocks, memory_budget_bytes=budget,
                       gpu_memory_utilization=main_util, speculative_config=spec)
    light_config = dict(**common, memory_budget_bytes=light_budget, gpu_memory_utilization=light_util)

    def start(spec: CoreSpec, started: list):  # noqa: ANN202 - (engine, its model_info)
        if core_process:
            eng = _start_core(spec, started)
            return eng, eng.model_info
        eng = build_core(spec)
        return eng, model_info(eng)

    logs = dict(log_format=log_format, log_level=log_level, builder=build_core)
    main, info = start(CoreSpec(model, tokenizer, device, dtype, main_config, served_model_name, precision, **logs), [])
    main_name = info["name"]
    engines = {main_name: main}
    if light_model:
        light, light_info = start(CoreSpec(light_model, light_tokenizer, device, dtype, light_config, light_name,
                                           precision, clash=main_name, budget_flag="--light-memory-budget", **logs),
                                  [main])
        engines[light_info["name"]] = light

    try:
        template = resolve_chat_template(chat_template, info["chat_template"], bos_token=info["bos_token"],
                                         eos_token=info["eos_token"])
    except ValueError as exc:
        if core_process:
            for eng in engines.values():
                eng.shutdown()
        _die(str(exc))
    app = create_app(engines, admin_token=admin_token, default_model=main_name, chat_template=template,
                     max_body_bytes=body_limit, manage_engines=True, bind_host=host,
                     allowed_hosts=tuple(allowed_host), api_key=api_key or None)
    typer.echo(f"serving {', '.join(engines)} on http://{host}:{port} (admin API "
               f"{'enabled' if admin_token else 'disabled: no --admin-token'})", err=True)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(), access_log=access_log,
                            log_config=None, timeout_graceful_shutdown=int(DEFAULT_FLUSH_SECONDS))
    server = GracefulServer(config, app.state.server, grace_seconds=shutdown_grace_seconds)
    server.run()
    if not server.started:
        raise typer.Exit(3)   # uvicorn's STARTUP_FAILURE: the port is taken, the lifespan failed
    if server.forced:
        typer.echo("error: stopped by a second signal before the drain ended; in-flight requests were cut",
                   err=True)
        raise typer.Exit(1)
    if server.engine_failure is not None:
        typer.echo(f"error: the engine core process failed ({server.engine_failure}); exiting for a restart",
                   err=True)
        raise typer.Exit(1)


def generate(
    prompt: str = typer.Option(..., "--prompt", help="Prompt text."),
    model: Optional[str] = typer.Option(None, "--model",
                                        help="llama2.c .bin, HF directory or .gguf file; default: the demo model."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer"),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, max=2.0),
    seed: Optional[int] = typer.Option(None, "--seed"),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(-1, "--top-k"),
    repetition_penalty: float = typer.Option(1.0, "--repetition-penalty"),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=1),
    allow_long_max_model_len: bool = AllowLongOpt,
    device: str = typer.Option("cpu", "--device", help="auto | cpu | cuda | cuda:N"),
) -> None:
    """Generate one completion in-process and print only its text to stdout."""
    from inferctl.engine.sampling_params import SamplingParams, SamplingParamsError

    if prompt == "":
        _die("--prompt: must not be empty")
    device = check_device(device)
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, top_p=top_p,
                                top_k=top_k, repetition_penalty=repetition_penalty)
    except SamplingParamsError as exc:
        _die(f"--{exc.field.replace('_', '-')}: {exc.message}")
    from inferctl.engine.engine import LLMEngine

    bundle = _load(model, tokenizer, device)
    try:
        llm = LLMEngine(bundle, _config(max_model_len=max_model_len, allow_long_max_model_len=allow_long_max_model_len))
    except ValueError as exc:   # ConfigError: a --max-model-len past the model's maximum
        _die(_flag_message(str(exc)))
    ids = bundle.tokenizer.encode(prompt, bos=True)
    try:
        llm.add_request("generate-0", ids, params)
    except Exception as exc:  # noqa: BLE001 - AdmissionError and friends: a clean message
        _die(str(getattr(exc, "message", None) or exc))
    pieces: list[str] = []
    finish = None
    while llm.has_unfinished_requests():
        for out in llm.step():
            pieces.append(out.new_text or "")
            if out.finished:
                finish = out.finish_reason
    text = "".join(pieces)
    ends_line = sys.stdout.isatty()
    sys.stdout.write(text + ("\n" if ends_line else ""))
    sys.stdout.flush()
    # stdout and stderr into one file or pipe (2>&1): the footer on a line of its own; stdout alone
    # keeps the text exactly as generated
    glued = not ends_line and text and not text.endswith("\n") and _same_destination()
    typer.echo(("\n" if glued else "") + f"[finish_reason={finish} prompt_tokens={len(ids)}]", err=True)
    if finish == "error":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Attach ``engine serve`` and ``generate`` to the ``inferctl`` typer app."""
    engine_app = typer.Typer(name="engine", help="The bundled inference engine.", no_args_is_help=True)
    engine_app.command("serve")(serve)
    app.add_typer(engine_app, name="engine")
    # vLLM's habit: `vllm serve MODEL` → `inferctl serve MODEL`, the same command
    app.command("serve", help="Same as `inferctl engine serve` (vLLM's `vllm serve MODEL`).")(serve)
    app.command("generate")(generate)


def _same_destination() -> bool:
    """Whether stdout and stderr are one open file (``2>&1``); False when either cannot be checked."""
    try:
        return os.path.sameopenfile(sys.stdout.fileno(), sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):   # a stream without a descriptor (captured, closed)
        return False
