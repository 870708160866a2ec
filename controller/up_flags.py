"""The configuration ``inferctl up`` runs, from its flags: the model (``MODEL`` or ``--model``)
and ``--memory-budget`` checked before anything starts (:func:`up_flags`), and the launched
engines made from ``--replicas``, ``--model``, ``--memory-budget``, ``--engine-port``,
``--engine-arg`` and ``--controller-port`` over the defaults or a ``--config`` file
(:func:`up_config`; replicas named by :func:`replica_names`).
"""

from __future__ import annotations

import os

from inferctl.controller.config import DEFAULT_ENGINE_PORT, ConfigError, ControllerConfig, parse_config

#: ``inferctl up``'s replicas: names ``main-0`` … (``main`` alone for one), ports from the base on
MAX_REPLICAS = 64


def replica_names(n: int) -> list[str]:
    """``["main"]`` for one replica, else ``["main-0", …, "main-<n-1>"]``."""
    return ["main"] if n == 1 else [f"main-{i}" for i in range(n)]


def up_flags(positional: str | None, model: str | None, memory_budget: str | None) -> str | None:
    """``inferctl up``'s model (``MODEL``, vLLM's habit, or ``--model``: both only when equal)
    after checking it and ``--memory-budget`` before anything starts. Raises ConfigError naming
    the flag: the model given twice, a Hugging Face hub id (never downloaded), a bad size."""
    from inferctl.contract.units import SizeError, parse_size
    from inferctl.controller.config import looks_like_hub_id

    if positional is not None and model is not None and positional != model:
        raise ConfigError(f"--model: the model is given twice ({positional!r} as MODEL and {model!r} as --model);"
                          " give one")
    model = model if model is not None else positional
    if model and model != "demo" and looks_like_hub_id(model):
        raise ConfigError(f"--model: {model!r} looks like a Hugging Face hub id: hub ids are not downloaded; give"
                          " a local path (a llama2.c .bin, a Hugging Face directory or a .gguf file)")
    if memory_budget is not None:
        try:
            parse_size(memory_budget, "--memory-budget", min_bytes=1)
        except SizeError as exc:
            raise ConfigError(str(exc)) from None
    return model


def up_config(cfg: ControllerConfig, *, from_file: bool, replicas: int = 1, model: str | None = None,
              memory_budget: str | None = None, engine_port: int | None = None,
              engine_args: list[str] | None = None, controller_port: int | None = None,
              cpus: int | None = None) -> ControllerConfig:
    """The configuration ``inferctl up`` runs: ``cfg`` (a file's, or the defaults) with its
    launched engines made from the flags. Without engines in ``cfg``: ``replicas`` bundled
    engines (:func:`replica_names`, ports ``engine_port`` (8000) + i); ``model``,
    ``memory_budget``, ``engine_args`` apply to each. With launched engines in ``cfg``: the flags
    apply to the first (``replicas`` must be 1). N > 1 replicas without ``--num-threads`` in
    ``engine_args`` get ``--num-threads max(1, cpus // N)`` each (``cpus``: this process's usable
    CPUs by default), so they split the cores instead of stalling on each other's threads
    (docs/performance.md, wave 7). Raises :class:`ConfigError` naming the flag or field."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ConfigError(f"--replicas: must be 1..{MAX_REPLICAS}, got {replicas}")
    data = cfg.model_dump()
    launched = [e for e in data["engines"] if e.get("launch") is not None]
    if data["engines"] and replicas > 1:
        raise ConfigError("--replicas: the configuration lists engines; list the replicas there"
                          " (or leave its engines out)")
    if not launched and not (from_file and data["engines"]):
        base = DEFAULT_ENGINE_PORT if engine_port is None else engine_port
        if base + replicas - 1 > 65535:
            raise ConfigError(f"--engine-port: {base} + {replicas} replicas runs past port 65535")
        for i, name in enumerate(replica_names(replicas)):
            data["engines"].append({"name": name, "kind": "bundled", "url": None, "launch": {"port": base + i}})
        launched = data["engines"][-replicas:]
        engine_port = None
    targets = launched if replicas > 1 else launched[:1]
    if not targets and (model or memory_budget or engine_port or engine_args):
        raise ConfigError("--model/--memory-budget/--engine-port need an engine to launch; the config launches none")
    for e in targets:
        for key, value in (("model", model), ("memory_budget", memory_budget), ("port", engine_port)):
            if value is not None:
                e["launch"][key] = value
        if engine_args:
            e["launch"]["args"] = list(e["launch"].get("args") or []) + list(engine_args)
        if replicas > 1 and not any(a.split("=")[0] == "--num-threads" for a in e["launch"].get("args") or []):
            share = max(1, (cpus or len(os.sched_getaffinity(0))) // replicas)
            e["launch"]["args"] = list(e["launch"].get("args") or []) + ["--num-threads", str(share)]
        if engine_port is not None or e.get("url") is None:
            e["url"] = None            # derived from launch.host/port again
    if controller_port is not None:
        data["listen"]["port"] = controller_port
    return parse_config(data)

