"""The controller's commands of ``inferctl`` (typer + rich); :func:`register` adds them to the
root app, which the front door (``inferctl/cli.py``) composes with the engine's, the
dashboards' and the tools' commands.

Every command here talks to a running controller over HTTP (``--url``, default
``$INFERCTL_URL`` or ``http://127.0.0.1:8900``; admin token ``--token`` or
``$INFERCTL_ADMIN_TOKEN``; the client plumbing is ``controller/admin_client.py``). ``up`` and
``controller run``, which run the controller rather than talk to one, are in
``controller/cli_run.py``; :func:`register` adds them too:

* ``inferctl up`` — start an engine (``--replicas N``: N engines and the router in front) and the
  controller in the foreground (Ctrl-C stops all).
* ``inferctl controller run --config FILE`` — run the controller from a configuration file.
* ``inferctl status`` / ``inferctl events`` — what the controller sees and did.
* ``inferctl degrade|rollback|drain|undrain|restart|unpin [--engine NAME]`` — engine actions.
* ``inferctl reset-gpu N [--yes] [--dry-run]`` — a GPU reset through the rails.
* ``inferctl release-gpu N [--yes]`` — release an isolated / lost GPU after a node reboot or a
  GPU replacement.
* ``inferctl pause|resume [--engine NAME | --gpu N]`` — pause / resume automatic actions.

Errors are one line on stderr and exit code 1 (2 for bad usage); never a traceback.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any, Callable, Optional

import typer

from inferctl.controller.admin_client import (ACTOR_CHARS, ACTOR_ENV, MAX_TIMEOUT_SECONDS, TokenFileOpt, TokenOpt,
                                              UrlOpt, _base, _check_actor, _check_reason, _check_timeout, _die,
                                              _request, _shown, _token)
from inferctl.controller.cli_run import controller_run, up

EngineOpt = typer.Option(None, "--engine", "-e", help="Engine name (default: the only engine).")


#: Console width for a pipe or a file: wide enough that no row is cut or folded (rich's default is 80)
PIPE_WIDTH = 10_000


def _console():  # noqa: ANN202 - rich Console, imported lazily so --help stays fast
    import sys

    from rich.console import Console

    # a pipe or a file (`| cat`, `| tee`, a log) gets full rows rather than rich's 80-column cut
    return Console(highlight=False, width=None if sys.stdout.isatty() else PIPE_WIDTH)


def _when(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "-"
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _fmt_seconds(v: Any) -> str:
    """A duration for people: ``1800`` → ``1800 s (30 min)``; no data → ``-``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "-"
    return f"{v:g} s ({v / 60:g} min)" if v >= 60 else f"{v:g} s"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _bytes(v: Any) -> str:
    if not isinstance(v, (int, float)):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return str(v)


# --------------------------------------------------------------------------- read commands
def status(url: Optional[str] = UrlOpt,
           as_json: bool = typer.Option(False, "--json", help="Print the raw /status JSON.")) -> None:
    """Engines (mode, queue, memory, policy states), GPUs and rails, from the controller."""
    _, doc = _request("GET", url, "/status", expect=("controller", "engines"))
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    from rich.table import Table

    con = _console()
    c = doc.get("controller", {})
    con.print(f"controller {_shown(url)}  up {_fmt(c.get('uptime_seconds'))} s, "
              f"last event #{c.get('last_event_id')}, actions running: "
              f"{', '.join(c.get('actions_in_flight') or []) or 'none'}")
    t = Table(title="engines")
    for col in ("engine", "url", "up", "precision", "draining", "running", "waiting", "memory free",
                "policies"):
        t.add_column(col)
    for name, e in sorted((doc.get("engines") or {}).items()):
        pols = ", ".join(f"{k}={(v or {}).get('state', '?')}" for k, v in sorted((e.get("policies") or {}).items()))
        mem = e.get("memory") or {}
        t.add_row(name, _fmt(e.get("url")), _fmt(e.get("up")), _fmt(e.get("precision")), _fmt(e.get("draining")),
                  _fmt(e.get("running")), _fmt(e.get("waiting")), _bytes(mem.get("free_bytes")), pols or "-")
    con.print(t)
    g = doc.get("gpus") or {}
    gt = Table(title=f"GPUs (source {g.get('source')}{', simulated' if g.get('simulated') else ''},"
                     f" telemetry {'up' if g.get('ok') else 'DOWN' if g.get('ok') is False else '?'})")
    for col in ("index", "uuid", "name", "used", "total", "lost", "health"):
        gt.add_column(col)
    hw = ((g.get("policies") or {}).get("hardware") or {}).get("gpus") or {}
    for d in g.get("devices") or []:
        health = (hw.get(d.get("uuid")) or {}).get("state") or d.get("health")
        gt.add_row(_fmt(d.get("index")), _fmt(d.get("uuid")), _fmt(d.get("name")),
                   _bytes(d.get("memory_used_bytes")), _bytes(d.get("memory_total_bytes")),
                   _fmt(d.get("lost")), _fmt(health))
    con.print(gt)
    if g.get("error"):
        con.print(f"GPU telemetry error: {g['error']}")
    rails = doc.get("rails")
    if rails:
        con.print(f"rails: dry_run={_fmt(rails.get('dry_run'))}, one reset per GPU per "
                  f"{_fmt_seconds(rails.get('min_interval_seconds'))}, reset in progress: "
                  f"{_fmt(rails.get('in_progress'))}, lost GPUs: {rails.get('lost') or 'none'}")


def _event_table(events: list[dict]):  # noqa: ANN202
    from rich.table import Table

    t = Table()
    for col in ("id", "time", "kind", "source", "target", "severity", "reason"):
        t.add_column(col, overflow="fold")
    for e in events:
        sev = e.get("severity")
        style = {"critical": "bold red", "warning": "yellow"}.get(sev, "")
        t.add_row(str(e.get("id")), _when(e.get("time")), _fmt(e.get("kind")), _fmt(e.get("source")),
                  _fmt(e.get("target")), f"[{style}]{sev}[/]" if style else _fmt(sev), _fmt(e.get("reason")))
    return t


def events(url: Optional[str] = UrlOpt,
           since_id: Optional[int] = typer.Option(None, "--since-id", min=0, help="Only events after this id."),
           limit: int = typer.Option(50, "--limit", min=1, max=1000, help="At most this many (1..1000)."),
           kind: Optional[str] = typer.Option(None, "--kind", help="observation, transition, decision, action,"
                                              " step, refusal, error, escalation, lifecycle"),
           target: Optional[str] = typer.Option(None, "--target", help="Engine name or gpu:N."),
           as_json: bool = typer.Option(False, "--json", help="Print JSON lines, one event per line."),
           follow: bool = typer.Option(False, "--follow", "-f",
                                       help="Keep printing new events (Ctrl-C stops).")) -> None:
    """The controller's event log: transitions, actions with their inputs and outcomes, refusals."""
    params: dict[str, Any] = {"limit": limit}
    for k, v in (("since_id", since_id), ("kind", kind), ("target", target)):
        if v is not None:
            params[k] = v
    con = None if as_json else _console()
    try:
        while True:
            _, doc = _request("GET", url, "/events", params=params, expect=("events",))
            rows = doc.get("events")
            if not isinstance(rows, list) or not all(isinstance(e, dict) for e in rows):
                _die(f"{_shown(url)} answered GET /events with 'events' that is not a list of events")
            if as_json:
                for e in rows:
                    typer.echo(json.dumps(e))
            elif rows or not follow:
                con.print(_event_table(rows))
            if not follow:
                return
            if rows:
                params["since_id"] = rows[-1]["id"]
            elif "since_id" not in params:
                params["since_id"] = doc.get("last_id") or 0
            time.sleep(1.0)
    except KeyboardInterrupt:
        return


# --------------------------------------------------------------------------- actions
def _pick_engine(url: Optional[str], engine: Optional[str]) -> str:
    if engine:
        return engine
    _, doc = _request("GET", url, "/status", expect=("controller", "engines"))
    engines = doc.get("engines")
    names = sorted(engines.keys()) if isinstance(engines, dict) else []
    if len(names) == 1:
        return names[0]
    _die(f"--engine is required: the controller has {len(names)} engines"
         f" ({', '.join(names) or 'none'})", code=2)
    return ""  # unreachable


def _print_result(doc: dict, status_code: int) -> None:
    ok = bool(doc.get("ok"))
    word = "ok" if ok else ("refused" if doc.get("refused") else "failed")
    typer.echo(f"{word}: {doc.get('message')}" + (f"  (event #{doc['event_id']})" if doc.get("event_id") else ""),
               err=not ok)
    if not ok:
        raise typer.Exit(1)


def _engine_action(action: str, url: Optional[str], token: Optional[str], engine: Optional[str],
                   timeout: float = 30.0, token_file: Optional[str] = None, force: bool = False) -> None:
    _check_timeout(timeout)
    tok = _token(token, token_file)
    name = _pick_engine(url, engine)
    body: dict[str, Any] = {"engine": name, "force": True} if force else {"engine": name}
    code, doc = _request("POST", url, f"/actions/{action}", token=tok, body=body,
                         timeout=timeout, ok_statuses=(200, 409, 502), expect=("ok", "message"))
    _print_result(doc, code)


def _engine_action_command(action: str, help_text: str) -> Callable[..., None]:
    """The command ``inferctl <action> [--url] [--token] [--engine]``: POST /actions/<action>
    for one engine, ``help_text`` its help."""
    def command(url: Optional[str] = UrlOpt, token: Optional[str] = TokenOpt,
                engine: Optional[str] = EngineOpt, token_file: Optional[str] = TokenFileOpt) -> None:
        _engine_action(action, url, token, engine, token_file=token_file)

    command.__doc__ = help_text
    return command


#: The one-engine actions without options of their own: (command name, help).
ENGINE_ACTIONS = (
    ("degrade", "Switch an engine to int8 now (the precision policy rolls back after its hold)."),
    ("rollback", "Switch an engine back to full precision now."),
    ("drain", "Stop admitting new requests on an engine (in-flight requests finish)."),
    ("undrain", "Admit requests again on a drained engine."),
)


def restart(url: Optional[str] = UrlOpt, token: Optional[str] = TokenOpt,
            engine: Optional[str] = EngineOpt,
            timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait (drain + restart +"
                                          f" health; 1..{MAX_TIMEOUT_SECONDS:g})."),
            token_file: Optional[str] = TokenFileOpt,
            force: bool = typer.Option(False, "--force", help="Skip the fleet rails (max_unavailable, never"
                                       " the last ready replica while it has work).")) -> None:
    """Take an engine the controller launched out of rotation (when the fleet rails allow), drain
    it, wait for in-flight requests, restart it, wait for /ready and put it back."""
    _engine_action("restart", url, token, engine, timeout=timeout, token_file=token_file, force=force)


def unpin(url: Optional[str] = UrlOpt, token: Optional[str] = TokenOpt,
          engine: Optional[str] = EngineOpt, token_file: Optional[str] = TokenFileOpt) -> None:
    """Release the precision flap guard's int8 pin (rollback allowed again after the hold)."""
    tok = _token(token, token_file)
    name = _pick_engine(url, engine)
    code, doc = _request("POST", url, "/actions/unpin", token=tok, body={"engine": name},
                         ok_statuses=(200,), expect=("ok", "message"))
    typer.echo(f"ok: {doc.get('message')}")


def _confirm_or_exit(question: str, verb: str) -> None:
    """Ask ``question``; anything but yes — including no answer (stdin closed, Ctrl-C) — exits 1
    having done nothing."""
    try:
        confirmed = typer.confirm(question, default=False)
    except (typer.Abort, EOFError, KeyboardInterrupt):
        confirmed = False
        typer.echo("", err=True)
    if not confirmed:
        typer.echo(f"aborted: nothing done (pass --yes to {verb} without asking)", err=True)
        raise typer.Exit(1)


def reset_gpu(gpu: int = typer.Argument(..., min=0, help="GPU index (as nvidia-smi numbers it)."),
              url: Optional[str] = UrlOpt, token: Optional[str] = TokenOpt,
              yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
              dry_run: bool = typer.Option(False, "--dry-run", help="Check the rails and show the"
                                           " nvidia-smi commands; run nothing."),
              timeout: float = typer.Option(600.0, "--timeout", help="Seconds to wait for the reset"
                                            f" (1..{MAX_TIMEOUT_SECONDS:g})."),
              token_file: Optional[str] = TokenFileOpt) -> None:
    """Reset GPU N (nvidia-smi --gpu-reset) through the rails: never a lost GPU, one at a time,
    at most one per GPU per interval, persistence mode restored, verified afterwards."""
    _check_timeout(timeout)
    tok = _token(token, token_file)
    _base(url)          # a bad --url is bad usage before anything is asked
    if not dry_run and not yes:
        _confirm_or_exit(f"Reset GPU {gpu}? Engines the controller launched on it are drained"
                         " and restarted; other processes on it make the reset refuse.", "reset")
    body: dict[str, Any] = {"gpu": gpu}
    if dry_run:
        body["dry_run"] = True
    code, doc = _request("POST", url, "/actions/reset-gpu", token=tok, body=body, timeout=timeout,
                         ok_statuses=(200, 409, 502), expect=("ok", "message"))
    details = doc.get("details") if isinstance(doc.get("details"), dict) else {}
    steps = details.get("steps") if isinstance(details.get("steps"), list) else []
    for step in (s for s in steps if isinstance(s, dict)):
        argv = " ".join(str(a) for a in (step.get("argv") or [])) or str(step.get("step"))
        mark = "would run" if step.get("planned") else ("ok" if step.get("ok") else "FAILED")
        typer.echo(f"  {mark:9} {argv}")
    typer.echo(f"outcome: {details.get('outcome') or ('success' if doc.get('ok') else 'failed')}")
    _print_result(doc, code)


def release_gpu(gpu: int = typer.Argument(..., min=0, help="GPU index (as nvidia-smi numbers it)."),
                url: Optional[str] = UrlOpt, token: Optional[str] = TokenOpt,
                yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
                timeout: float = typer.Option(30.0, "--timeout", help="Seconds to wait for the controller"
                                              f" (1..{MAX_TIMEOUT_SECONDS:g})."),
                token_file: Optional[str] = TokenFileOpt) -> None:
    """Release GPU N after the node was rebooted or the GPU replaced: the hardware policy's
    isolation and the reset rails' lost mark are cleared (refused while the GPU source shows it
    lost, or when there is nothing to release)."""
    _check_timeout(timeout)
    tok = _token(token, token_file)
    _base(url)          # a bad --url is bad usage before anything is asked
    if not yes:
        _confirm_or_exit(f"Release GPU {gpu}? Only after the node was rebooted or the GPU"
                         " replaced: the controller will use it and may reset it again.", "release")
    _, doc = _request("POST", url, "/actions/release-gpu", token=tok, body={"gpu": gpu}, timeout=timeout,
                      ok_statuses=(200,), expect=("ok", "message"))
    typer.echo(f"ok: {doc.get('message')}" + (f"  (event #{doc['event_id']})" if doc.get("event_id") else ""))


ActorOpt = typer.Option(None, "--actor",
                        help=f"Your name for the event log (operator:NAME; {ACTOR_CHARS}; default"
                             f" ${ACTOR_ENV}, else 'operator').")
GpuScopeOpt = typer.Option(None, "--gpu", min=0, max=999, help="Only GPU N (and the engines on it).")
ScopeEngineOpt = typer.Option(None, "--engine", "-e", help="Only this engine (default: every automatic action).")


def _scope_body(engine: Optional[str], gpu: Optional[int]) -> dict[str, Any]:
    if engine is not None and gpu is not None:
        _die("--engine, --gpu: give at most one (neither pauses every automatic action)", code=2)
    return {"engine": engine} if engine is not None else {"gpu": gpu} if gpu is not None else {}


def pause(reason: str = typer.Option(..., "--reason", "-r", help="Why (shown in /status and every event)."),
          engine: Optional[str] = ScopeEngineOpt, gpu: Optional[int] = GpuScopeOpt,
          actor: Optional[str] = ActorOpt, url: Optional[str] = UrlOpt, token: Optional[str] = TokenOpt,
          token_file: Optional[str] = TokenFileOpt) -> None:
    """Pause automatic actions (all, one engine or one GPU): policies still decide and log
    "would have acted"; nothing is executed until `inferctl resume`. Operator commands still act."""
    reason, actor = _check_reason(reason), _check_actor(actor)
    tok = _token(token, token_file)
    _, doc = _request("POST", url, "/actions/pause", token=tok, body={**_scope_body(engine, gpu), "reason": reason},
                      ok_statuses=(200,), expect=("ok", "message"), actor=actor)
    typer.echo(f"ok: {doc.get('message')}" + (f"  (event #{doc['event_id']})" if doc.get("event_id") else ""))


def resume(engine: Optional[str] = ScopeEngineOpt, gpu: Optional[int] = GpuScopeOpt,
           actor: Optional[str] = ActorOpt, url: Optional[str] = UrlOpt, token: Optional[str] = TokenOpt,
           token_file: Optional[str] = TokenFileOpt) -> None:
    """Resume automatic actions for the scope an operator paused (same --engine / --gpu)."""
    actor = _check_actor(actor)
    tok = _token(token, token_file)
    _, doc = _request("POST", url, "/actions/resume", token=tok, body=_scope_body(engine, gpu),
                      ok_statuses=(200,), expect=("ok", "message"), actor=actor)
    typer.echo(f"ok: {doc.get('message')}" + (f"  (event #{doc['event_id']})" if doc.get("event_id") else ""))


def register(app: typer.Typer) -> None:
    """Add the controller's commands to the ``inferctl`` typer ``app``: ``controller run``,
    ``status``, ``events``, the engine actions, ``restart``, ``unpin``, ``reset-gpu``,
    ``release-gpu`` (``up`` first). typer lists an app's commands in the order they are added (and
    its command groups, such as ``controller``, after them)."""
    app.command()(up)         # first: the command a newcomer starts with
    controller_app = typer.Typer(help="Run the controller.", no_args_is_help=True)
    controller_app.command("run")(controller_run)
    app.add_typer(controller_app, name="controller")
    app.command()(status)
    app.command()(events)
    for action, help_text in ENGINE_ACTIONS:
        app.command(name=action)(_engine_action_command(action, help_text))
    app.command()(restart)
    app.command()(unpin)
    app.command("reset-gpu")(reset_gpu)
    app.command("release-gpu")(release_gpu)
    app.command()(pause)
    app.command()(resume)
