"""Breaker regressions for the engine's and the router's command lines: flags that crashed.

* ``engine serve --num-threads 100000`` died with SIGSEGV (libgomp could not create the
  threads): now at most :data:`~engine.cli.MAX_NUM_THREADS` (1024, fixed on every host).
* ``--log-level trace`` (``router``, ``engine serve``) reached ``logging`` (a traceback, or an
  error naming no flag): now one of debug, info, warning, error, critical, any case.
* ``--device tpu`` (``engine serve``, ``generate``) reached torch (a traceback): now
  auto | cpu | cuda | cuda:N.
* A huge ``--block-size`` / ``--num-kv-blocks`` (or a ``--memory-budget`` past the host's
  memory) crashed on the KV pool's allocation: the block size is bounded by what the
  paged-attention kernels take (256), the pool by the host's available memory, and a failed
  allocation is a clear error naming the flag.
* ``--max-body-bytes`` (``router``, ``engine serve``) had no upper bound: now 1 GiB.
* The standalone router logged every health probe at INFO through httpx's logger: httpx and
  httpcore are quieted to WARNING unless ``--log-level debug``.
* A malformed Hugging Face ``config.json`` (a list, a null or a string where a count goes)
  stopped ``engine serve`` / ``generate`` with a traceback or a message naming no file.

Every refusal exits 2 with ``error: --flag: ...`` and never a traceback.
"""

from __future__ import annotations

import json
import logging

import pytest
import typer
from typer.testing import CliRunner

from inferctl.cli import app
from inferctl.engine import cli as engine_cli

ROUTER = ["router", "--engine", "a=http://127.0.0.1:9", "--port", "8080"]


def _run(args: list[str]):  # noqa: ANN202 - click's Result
    return CliRunner().invoke(app, args)


def _serve(args: list[str]):  # noqa: ANN202
    return _run(["engine", "serve", "--model", "demo", "--port", "0", "--device", "cpu", *args])


def _refused(r, *words: str) -> str:
    """The run exited 2 with an ``error:`` line holding ``words``, and no traceback."""
    out = r.output
    assert r.exit_code == 2, (r.exit_code, out, r.exception)
    assert "Traceback" not in out and "error: " in out, out
    for w in words:
        assert w in out, (w, out)
    return out


@pytest.fixture(autouse=True)
def never_serve(monkeypatch):
    """uvicorn never serves here: a flag the CLI wrongly accepts ends the run (exit 3, uvicorn's
    start-up failure) instead of a server that runs forever."""
    import uvicorn

    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **k: None)


@pytest.fixture
def captured(monkeypatch):
    """Replace the engine build: the config the CLI would start with, then exit 7."""
    seen = []

    def capture(bundle, config, precision, budget_flag="--memory-budget"):  # noqa: ANN001, ANN202
        seen.append(config)
        raise typer.Exit(7)

    monkeypatch.setattr("inferctl.engine.cli._build_engine", capture)
    return seen


# ---------------------------------------------------------------- --num-threads
@pytest.mark.parametrize("value", ["1025", "100000"])
def test_num_threads_above_the_bound_is_refused_before_torch_sees_it(captured, value):
    _refused(_serve(["--num-threads", value]), "--num-threads: must be at most 1024", value)
    assert captured == []   # never reached torch.set_num_threads


def test_num_threads_at_the_bound_is_accepted(captured):
    assert _serve(["--num-threads", "1024"]).exit_code == 7
    assert captured[0].num_threads == 1024


def test_num_threads_help_says_the_bound():
    r = _run(["engine", "serve", "--help"])
    assert r.exit_code == 0 and "1024" in " ".join(r.output.split())


# ---------------------------------------------------------------- --log-level
@pytest.mark.parametrize("level", ["trace", "verbose", ""])
def test_engine_serve_refuses_an_unknown_log_level(captured, level):
    _refused(_serve(["--log-level", level]), "--log-level: must be one of debug, info, warning, error, critical")
    assert captured == []


@pytest.mark.parametrize("level", ["DEBUG", "Warning", "critical"])
def test_engine_serve_takes_any_case_of_a_known_level(captured, level):
    assert _serve(["--log-level", level]).exit_code == 7


@pytest.mark.parametrize("level", ["trace", "TRACE", "notice"])
def test_router_refuses_an_unknown_log_level(level):
    _refused(_run([*ROUTER, "--log-level", level]), "--log-level: must be one of debug, info, warning, error, critical",
             repr(level))


# ---------------------------------------------------------------- --device
@pytest.mark.parametrize("device", ["tpu", "cuda:", "cuda:x", "cpu:0", "gpu"])
def test_engine_serve_refuses_an_unknown_device(captured, device):
    _refused(_serve(["--device", device]), "--device: must be auto, cpu, cuda or cuda:N", repr(device))
    assert captured == []


@pytest.mark.parametrize("device", ["tpu", "mps"])
def test_generate_refuses_an_unknown_device(device):
    _refused(_run(["generate", "--prompt", "hi", "--device", device]), "--device: must be auto, cpu, cuda or cuda:N")


def test_engine_serve_takes_cpu_in_any_case(captured):
    assert _serve(["--device", "CPU"]).exit_code == 7


def test_a_cuda_index_this_machine_lacks_is_refused(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(typer.Exit) as ex:
        engine_cli._load("demo", None, "cuda:5")
    assert ex.value.exit_code == 2


# ---------------------------------------------------------------- --block-size / --num-kv-blocks
def test_block_size_bound_is_the_attention_kernels_bound():
    from inferctl.engine.attention import KERNEL_MAX_BLOCK_SIZE

    assert engine_cli.MAX_BLOCK_SIZE == KERNEL_MAX_BLOCK_SIZE == 256


@pytest.mark.parametrize("value", ["257", "100000000"])
def test_block_size_above_the_kernels_bound_is_refused(captured, value):
    _refused(_serve(["--block-size", value]), "--block-size: must be at most 256 tokens", value)
    assert captured == []


def test_block_size_at_the_bound_is_accepted(captured):
    assert _serve(["--block-size", "256"]).exit_code == 7 and captured[0].block_size == 256


def test_num_kv_blocks_past_the_host_memory_is_refused_naming_the_flag():
    out = _refused(_serve(["--num-kv-blocks", "100000000000"]), "--num-kv-blocks: 100000000000 KV blocks",
                   "do not fit")
    assert "num_kv_blocks" not in out


def test_memory_budget_past_the_host_memory_is_refused_naming_the_flag():
    _refused(_serve(["--memory-budget", "100000TiB"]), "--memory-budget: ", "do not fit")


def _plan(num_kv_blocks=None, **cfg):  # noqa: ANN001, ANN202 - plan_memory on the demo model, CPU
    import torch

    from inferctl.engine.config import EngineConfig
    from inferctl.engine.loader import load_model
    from inferctl.engine.memory_plan import ActivationModel, plan_memory

    bundle = load_model("demo")
    model = bundle.model
    config = EngineConfig(num_kv_blocks=num_kv_blocks, **cfg).resolve(model.args.max_seq_len, "cpu", model.dtype)
    return plan_memory(model, model.args, config, torch.device("cpu"), ActivationModel.of(model.args, model.dtype))


def test_the_pool_is_bounded_by_the_host_available_memory(monkeypatch):
    from inferctl.engine.config import ConfigError

    monkeypatch.setattr("inferctl.engine.memory_plan.host_available_bytes", lambda: 1 << 20)
    with pytest.raises(ConfigError) as err:
        _plan(num_kv_blocks=100_000)
    assert err.value.field == "num_kv_blocks" and "at most" in err.value.message
    assert _plan(num_kv_blocks=4).num_kv_blocks == 4   # a pool that fits still plans


def test_a_failed_cpu_allocation_is_a_config_error(monkeypatch):
    """Where the host's memory is not known, the CPU allocator's failure (a RuntimeError,
    not torch.OutOfMemoryError) is reported naming the flag, not as a traceback."""
    from inferctl.engine.config import ConfigError

    monkeypatch.setattr("inferctl.engine.memory_plan.host_available_bytes", lambda: None)
    with pytest.raises(ConfigError) as err:
        _plan(num_kv_blocks=10 ** 13)
    assert err.value.field == "num_kv_blocks" and "do not fit on cpu" in err.value.message


def test_host_available_bytes_is_a_positive_count():
    from inferctl.engine.memory_plan import host_available_bytes

    n = host_available_bytes()
    assert n is None or (isinstance(n, int) and n > 0)


# ---------------------------------------------------------------- --max-body-bytes
def test_router_max_body_bytes_above_1gib_is_refused():
    _refused(_run([*ROUTER, "--max-body-bytes", "2GiB"]), "--max-body-bytes: must be >= 1 and <= 1073741824")


def test_router_config_max_body_bytes_bounds():
    from inferctl.router.config import ConfigError, EngineSpec, RouterConfig

    base = {"engines": (EngineSpec("a", "http://127.0.0.1:8000"),)}
    assert RouterConfig(**base, max_body_bytes=1 << 30).validate()
    with pytest.raises(ConfigError, match="--max-body-bytes"):
        RouterConfig(**base, max_body_bytes=(1 << 30) + 1).validate()


def test_engine_max_body_bytes_above_1gib_is_refused(captured):
    _refused(_serve(["--max-body-bytes", "2GiB"]), "--max-body-bytes: must be at most 1073741824")
    assert captured == []
    assert _serve(["--max-body-bytes", "1GiB"]).exit_code == 7


# ---------------------------------------------------------------- router logging
@pytest.fixture
def router_logged(monkeypatch):
    """Run ``inferctl router`` with uvicorn's server replaced by one that logs as the probes'
    httpx client does and never starts (exit 3); restores the loggers it touches."""
    import uvicorn

    loggers = {n: logging.getLogger(n).level for n in ("httpx", "httpcore")}

    def run(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        logging.getLogger("httpx").info('HTTP Request: GET http://127.0.0.1:9/ready "HTTP/1.1 200 OK"')
        logging.getLogger("inferctl.router.test").info("router marker line")

    monkeypatch.setattr(uvicorn.Server, "run", run)
    yield lambda level: _run([*ROUTER, "--log-level", level])
    for name, level in loggers.items():
        logging.getLogger(name).setLevel(level)


def test_router_at_info_does_not_log_each_probe_request(router_logged):
    r = router_logged("info")
    assert r.exit_code == 3, r.output
    assert "router marker line" in r.output and "HTTP Request" not in r.output


def test_router_at_debug_logs_the_probe_requests(router_logged):
    r = router_logged("DEBUG")
    assert r.exit_code == 3, r.output
    assert "HTTP Request: GET http://127.0.0.1:9/ready" in r.output


# ---------------------------------------------------------------- a malformed HF config.json
@pytest.mark.parametrize("config, words", [
    ("[1, 2]", "must be a JSON object"),
    ("{not json", "invalid JSON"),
    ({"hidden_size": 64, "num_attention_heads": None, "num_hidden_layers": 1, "intermediate_size": 8,
      "vocab_size": 10}, "field 'num_attention_heads' must be an integer from 1 to 2,147,483,647, got None"),
    ({"hidden_size": "sixty-four", "num_attention_heads": 4, "num_hidden_layers": 1, "intermediate_size": 8,
      "vocab_size": 10}, "field 'hidden_size' must be an integer from 1 to 2,147,483,647, got 'sixty-four'"),
    ({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1, "intermediate_size": 8},
     "missing field 'vocab_size'"),
    ({"hidden_size": 64, "num_attention_heads": 3, "num_hidden_layers": 1, "intermediate_size": 8,
      "vocab_size": 10}, "must be divisible by n_heads (3)"),
])
def test_malformed_hf_config_names_the_file_and_the_key(tmp_path, config, words):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    out = _refused(_run(["generate", "--prompt", "hi", "--model", str(d)]), words)
    assert f"error: {d / 'config.json'}: " in out


def test_truncated_llama2c_bin_is_refused_by_the_engine_loader(tmp_path, stories_dir):
    data = (stories_dir / "stories260K.bin").read_bytes()
    cut = tmp_path / "cut.bin"
    cut.write_bytes(data[: len(data) // 2])
    (tmp_path / "tok512.bin").write_bytes((stories_dir / "tok512.bin").read_bytes())
    out = _refused(_run(["generate", "--prompt", "hi", "--model", str(cut)]), "implies")
    assert f"file has {len(data) // 2} bytes" in " ".join(out.split())
