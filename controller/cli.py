"""The controller's commands of ``inferctl`` (typer + rich); :func:`register` adds them to the
root app, which the front door (``inferctl/cli.py``) composes with the engine's, the
dashboards' and the tools' commands.

Every command here but ``up`` and ``controller run`` talks to a running controller over HTTP
(``--url``, default ``$INFERCTL_URL`` or ``http://127.0.0.1:8900``; admin token ``--token`` or
``$INFERCTL_ADMIN_TOKEN``):

* ``inferctl up`` — start an engine (``--replicas N``: N engines and the router in front) and the
  controller in the foreground (Ctrl-C stops all).
* ``inferctl controller run --config FILE`` — run the controller from a configuration file.
* ``inferctl status`` / ``inferctl events`` — what the controller sees and did.
* ``inferctl degrade|rollback|drain|undrain|restart|unpin [--engine NAME]`` — engine actions.
* ``inferctl reset-gpu N [--yes] [--dry-run]`` — a GPU reset through the rails.
* ``inferctl release-gpu N [--yes]`` — release an isolated / lost GPU after a node reboot or a
  GPU replacement.

Errors are one line on stderr and exit code 1 (2 for bad usage); never a traceback.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import time
import unicodedata
from typing import Any, Callable, NoReturn, Optional

import typer

DEFAULT_URL = "http://127.0.0.1:8900"
#: Largest answer read from the controller: 1000 events with their inputs are a few MiB.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
URL_ENV = "INFERCTL_URL"
TOKEN_ENV = "INFERCTL_ADMIN_TOKEN"
ACTOR_ENV = "INFERCTL_ACTOR"
#: ``--timeout`` of a client command (s): at least a second, at most an hour (inf, nan and huge
#: values were an OverflowError traceback).
MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS = 1.0, 3600.0
#: What the controller accepts as ``X-Inferctl-Actor`` (controller/api.py ``ACTOR_NAME``), in words.
ACTOR_CHARS = "1-64 characters of letters, digits, '_', '.', '@', '-'"

UrlOpt = typer.Option(None, "--url", help=f"Controller URL (default ${URL_ENV} or {DEFAULT_URL}).")
TokenOpt = typer.Option(None, "--token", help=f"Admin token (default ${TOKEN_ENV}). A flag's value is visible"
                        f" to every user in `ps`: prefer ${TOKEN_ENV} or --token-file.")
TokenFileOpt = typer.Option(None, "--token-file", help="Read the admin token from this file (its first line).")
EngineOpt = typer.Option(None, "--engine", "-e", help="Engine name (default: the only engine).")


# --------------------------------------------------------------------------- HTTP plumbing
def _die(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _base(url: Optional[str]) -> str:
    """The controller's base URL (``--url``, else ``$INFERCTL_URL``, else the default); a value
    that is not an http(s) URL with a valid port is bad usage (exit 2, naming where it came from):
    an empty ``--url``, control characters or bytes that are not UTF-8 (which no HTTP request
    line can carry). Credentials in the URL are never echoed (``<credentials>``). An empty
    ``$INFERCTL_URL`` counts as unset."""
    from inferctl.contract.http import redact_url
    from inferctl.controller.config import check_http_url

    if url is not None and not url.strip():
        _die(f"--url: empty; give the controller's URL (e.g. {DEFAULT_URL}) or leave --url out"
             f" (default ${URL_ENV} or {DEFAULT_URL})", code=2)
    where = "--url" if url else f"${URL_ENV}" if os.environ.get(URL_ENV) else None
    base = url or os.environ.get(URL_ENV) or DEFAULT_URL
    if where is not None:
        bad = next((c for c in base if unicodedata.category(c) in ("Cc", "Cs")), None)
        if bad is not None:
            what = "bytes that are not UTF-8" if unicodedata.category(bad) == "Cs" else "control characters"
            _die(f"{where}: {redact_url(base)!r} holds {what}; give an http:// or https:// URL such as"
                 f" {DEFAULT_URL}", code=2)
        try:
            check_http_url(base)
        except ValueError:
            _die(f"{where}: {redact_url(base)!r} is not an http:// or https:// URL with a host and a port"
                 f" 1-65535 (e.g. {DEFAULT_URL})", code=2)
    return base.rstrip("/")


def _shown(url: Optional[str]) -> str:
    """The controller's base URL as messages and output show it: credentials as ``<credentials>``."""
    from inferctl.contract.http import redact_url

    return redact_url(_base(url))


def _check_timeout(timeout: float) -> float:
    """``--timeout`` when it is a number of seconds in :data:`MIN_TIMEOUT_SECONDS`..
    :data:`MAX_TIMEOUT_SECONDS`; exit 2 naming the flag and the limits otherwise (inf, nan,
    negative, huge: an OverflowError traceback before)."""
    if not (math.isfinite(timeout) and MIN_TIMEOUT_SECONDS <= timeout <= MAX_TIMEOUT_SECONDS):
        _die(f"--timeout: must be a number of seconds in {MIN_TIMEOUT_SECONDS:g}..{MAX_TIMEOUT_SECONDS:g},"
             f" got {timeout:g}", code=2)
    return timeout


def _check_actor(actor: Optional[str]) -> Optional[str]:
    """The operator's name sent as ``X-Inferctl-Actor``: ``--actor``, else ``$INFERCTL_ACTOR``
    (empty: none, the controller says ``operator``). A name the controller refuses (it travels in
    an HTTP header: ASCII only; a non-ASCII one was a UnicodeEncodeError traceback) is exit 2
    naming where it came from."""
    from inferctl.controller.api import ACTOR_NAME

    where = "--actor"
    if actor is None:
        actor, where = os.environ.get(ACTOR_ENV) or None, f"${ACTOR_ENV}"
    if actor is None:
        return None
    if ACTOR_NAME.fullmatch(actor) is None:
        _die(f"{where}: {actor[:80]!r} must be {ACTOR_CHARS} (it names you in the event log as"
             " operator:NAME)", code=2)
    return actor


def _check_reason(reason: str) -> str:
    """``--reason`` when the controller accepts it: not blank, at most ``MAX_REASON_CHARS``
    characters, no control characters, valid UTF-8; exit 2 naming ``--reason`` otherwise (the
    controller's own 400 named its body field ``reason``)."""
    from inferctl.controller.api import MAX_REASON_CHARS, blank_text, refused_char

    if blank_text(reason):
        _die("--reason: empty; say why automation is paused (shown in /status and every event)", code=2)
    if len(reason) > MAX_REASON_CHARS:
        _die(f"--reason: at most {MAX_REASON_CHARS} characters, got {len(reason)}", code=2)
    bad = refused_char(reason)
    if bad is not None:
        _die("--reason: control, format or separator characters (newline, tab, NUL, U+202E, U+2028, …) or bytes"
             f" that are not UTF-8 are not allowed; found {bad}", code=2)
    return reason


def _request(method: str, url: Optional[str], path: str, *, token: Optional[str] = None,
             params: dict | None = None, body: dict | None = None, timeout: float = 10.0,
             ok_statuses: tuple[int, ...] = (200,), expect: tuple[str, ...] = (),
             actor: Optional[str] = None) -> tuple[int, Any]:
    """One HTTP call to the controller: (status, JSON object). Unreachable / bad answers → exit
    1: an answer that is not a JSON object, or lacks the keys in ``expect`` (a controller's
    answer always has them), is not from a controller."""
    import httpx

    base = _base(url)
    shown = _shown(url)
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if actor:
        headers["X-Inferctl-Actor"] = actor      # the event log then names operator:ACTOR
    from inferctl.contract.http import redact_url
    from inferctl.controller.scrape.http import ResponseTooLarge, bounded_request

    try:
        with httpx.Client(timeout=timeout) as client:
            resp = bounded_request(client, method, f"{base}{path}", deadline_s=timeout,
                                   max_bytes=MAX_ANSWER_BYTES, params=params, json=body, headers=headers)
    except UnicodeEncodeError:           # a value from argv with bytes that are not UTF-8 (surrogates)
        _die("a value given holds bytes that are not UTF-8 (or, in a header, not ASCII): it cannot be sent;"
             " retype it", code=2)
    except ResponseTooLarge:
        _die(f"{shown} answered {method} {path} with more than {MAX_ANSWER_BYTES} bytes: not a controller's"
             " answer (is --url the controller?)")
    except httpx.ConnectError:
        _die(f"controller not reachable at {shown} (is `inferctl up` or `inferctl controller run` running?"
             f" set --url or ${URL_ENV})")
    except httpx.TimeoutException:
        _die(f"controller at {shown} did not answer {method} {path} within {timeout:g} s")
    except httpx.InvalidURL as exc:     # what check_http_url let through (a URL httpx cannot send)
        where = "--url" if url else f"${URL_ENV}"
        _die(f"{where}: {shown!r} is not a URL a request can be sent to ({redact_url(str(exc))})", code=2)
    except httpx.HTTPError as exc:
        _die(f"controller at {shown}: {type(exc).__name__}: {redact_url(str(exc))}")
    try:
        doc = resp.json()
    except (ValueError, RecursionError):
        _die(f"controller at {shown} answered {method} {path} with HTTP {resp.status_code} and no JSON")
    if not isinstance(doc, dict):
        _die(f"{shown} answered {method} {path} with HTTP {resp.status_code} and JSON that is not a"
             f" controller's (a {type(doc).__name__}, not an object): is --url the controller?")
    if resp.status_code == 401:
        _die(f"unauthorized: {_message(doc)} (pass --token or set ${TOKEN_ENV})")
    if resp.status_code == 404 and path in ("/status", "/events"):
        # every controller serves these: a 404 is another server, most often an engine
        _die(f"{shown}: this looks like an engine ({method} {path} 404): the controller listens on another port"
             f" (default {DEFAULT_URL.rsplit(':', 1)[1]})")
    if resp.status_code not in ok_statuses:
        _die(f"{_message(doc)} (HTTP {resp.status_code})")
    missing = [k for k in expect if k not in doc]
    if missing:
        _die(f"{shown} answered {method} {path} without {', '.join(repr(k) for k in missing)}:"
             " not a controller's answer (is --url the controller?)")
    return resp.status_code, doc


def _message(doc: Any) -> str:
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if doc.get("message"):
            return str(doc["message"])
    return json.dumps(doc)[:300]


def _token(token: Optional[str], token_file: Optional[str] = None) -> str:
    """The admin token a client command sends: ``--token``, else ``--token-file``'s content,
    else ``$INFERCTL_ADMIN_TOKEN``; exits 1 when none or refused by ``check_token_chars``, 2 when
    ``--token-file`` cannot be read (missing, empty, a directory or device, a pipe that gives no
    line within ``TOKEN_PIPE_SECONDS``: ``contract.http.read_token_file``)."""
    from inferctl.contract.http import check_token_chars, read_token_file

    if token and token_file:
        _die("--token-file: give either --token or --token-file, not both")
    tok, src = (token, "--token") if token else (os.environ.get(TOKEN_ENV), f"${TOKEN_ENV}")
    if token_file:
        try:
            tok, src = read_token_file(token_file, "--token-file"), "--token-file"
        except ValueError as exc:
            _die(str(exc), code=2)
    try:   # checked here: a token no header can carry was a traceback (non-ASCII) or h11's error
        if tok:
            return check_token_chars(tok, src)
    except ValueError as exc:
        _die(str(exc))
    _die(f"an admin token is required: pass --token-file, set ${TOKEN_ENV} or pass --token"
         " (`inferctl up` prints it at start)")


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


# --------------------------------------------------------------------------- running
def _server_token(config, token: Optional[str], token_file: Optional[str]) -> tuple[Optional[str], str]:  # noqa: ANN001
    """``(token, where it came from)`` for the controller's API: ``--token-file``, else
    ``--token`` / ``$INFERCTL_ADMIN_TOKEN``, else the configuration's ``admin_token`` /
    ``admin_token_env``; None: ``serve`` generates one. A given token must pass
    :func:`inferctl.contract.http.check_admin_token` (>= 16 characters, no leading ``-``):
    exit 2 naming the flag or field otherwise."""
    from inferctl.contract.http import check_admin_token, read_token_file

    if token and token_file:
        _die("--token-file: give either --token ($INFERCTL_ADMIN_TOKEN) or --token-file, not both", code=2)
    try:
        if token_file:
            src = f"--token-file {token_file}"
            return check_admin_token(read_token_file(token_file, "--token-file"), src), src
        if token:
            src = "--token / $INFERCTL_ADMIN_TOKEN"
            return check_admin_token(token, src), src
        tok = config.token()
        if tok:
            src = "the configuration (admin_token / admin_token_env)"
            return check_admin_token(tok, src), src
    except ValueError as exc:
        _die(str(exc), code=2)
    return None, "generated"


def _run_config(config, token: Optional[str], engine_log_dir: Optional[str], token_file: Optional[str] = None,  # noqa: ANN001
                allowed_hosts: tuple[str, ...] = (), router: Any = None,
                port_flags: Optional[dict[str, str]] = None) -> None:
    from inferctl.controller.up import serve

    tok, src = _server_token(config, token, token_file)
    code = serve(config, tok, token_source=src, echo=lambda s: typer.echo(s),
                 engine_log_dir=engine_log_dir, echo_error=lambda s: typer.echo(s, err=True),
                 allowed_hosts=tuple(allowed_hosts), router=router, port_flags=port_flags)
    raise typer.Exit(code)


#: ``--token`` of ``controller run`` / ``up`` (the API's own token).
ServerTokenOpt = typer.Option(None, "--token", envvar=TOKEN_ENV,
                              help="Admin token of the controller's API (>= 16 characters; else the config's; else "
                                   "generated and printed). A flag's value is visible to every user in `ps`: prefer "
                                   f"${TOKEN_ENV} or --token-file.")
AllowedHostOpt = typer.Option([], "--allowed-host",
                              help="Accept this Host header name on the controller's API (repeatable). Bound to "
                                   "loopback, only localhost/127.0.0.1/[::1] are accepted otherwise (DNS rebinding "
                                   "guard); bound elsewhere, any name unless some are listed.")


def _load(config_path: Optional[str]):  # noqa: ANN202
    from inferctl.controller.config import ConfigError, load_config, parse_config

    try:
        return load_config(config_path) if config_path else parse_config({})
    except ConfigError as exc:
        _die(str(exc), code=2)


def controller_run(config: str = typer.Option(..., "--config", "-c", help="YAML configuration file."),
                   token: Optional[str] = ServerTokenOpt,
                   engine_log_dir: Optional[str] = typer.Option(None, "--engine-log-dir",
                                                                help="Write launched engines' output here."),
                   token_file: Optional[str] = TokenFileOpt,
                   allowed_host: list[str] = AllowedHostOpt) -> None:
    """Run the controller from a configuration file until Ctrl-C (engines it launches stop with it)."""
    _run_config(_load(config), token, engine_log_dir, token_file, tuple(allowed_host))


def up(model_arg: Optional[str] = typer.Argument(None, metavar="MODEL", show_default=False,
                                                 help="Model path (same as --model, vLLM style)."),
       model: Optional[str] = typer.Option(None, "--model", help="Model path (llama2.c .bin, HF dir or .gguf"
                                           " file); default: the built-in demo model."),
       config: Optional[str] = typer.Option(None, "--config", "-c", help="YAML configuration (engines, GPU"
                                            " source, thresholds, holds, rails)."),
       replicas: int = typer.Option(1, "--replicas", "-n", min=1, help="Engines to launch (main-0 … on ports"
                                    " --engine-port + i) behind a router; 1: one engine named main, no router."),
       router_port: int = typer.Option(8080, "--router-port", min=1, max=65535, help="The router's port."),
       with_router: Optional[bool] = typer.Option(None, "--router/--no-router", help="Start the router"
                                                  " (default: when --replicas > 1)."),
       memory_budget: Optional[str] = typer.Option(None, "--memory-budget", help="Engine memory budget, e.g."
                                                   " 512MiB or 2GiB (binary units; default: what the model needs"
                                                   " on CPU, gpu_memory_utilization of the GPU on CUDA)."),
       engine_port: Optional[int] = typer.Option(None, "--engine-port", min=1, max=65535, show_default=False,
                                                 help="The engine's port (default 8000; replicas on 8000,"
                                                      " 8001, …; with --config, its first launched engine's)."),
       controller_port: Optional[int] = typer.Option(None, "--controller-port", min=0, max=65535,
                                                     show_default=False,
                                                     help="The controller's API port (default 8900, or the"
                                                          " config's listen.port; 0: any free port)."),
       token: Optional[str] = ServerTokenOpt,
       token_file: Optional[str] = TokenFileOpt,
       allowed_host: list[str] = AllowedHostOpt,
       engine_log_dir: Optional[str] = typer.Option(None, "--engine-log-dir",
                                                    help="Write the engines' (and router's) output here."),
       engine_arg: list[str] = typer.Option([], "--engine-arg", help="Extra `inferctl engine serve` argument"
                                            " (repeatable), e.g. --engine-arg=--max-num-seqs=32.")) -> None:
    """Start the bundled engine(s), the router and the controller; print their URLs (the router's
    first: the one clients use); run until Ctrl-C.

    Without --config: --replicas bundled engines ("main", or main-0 … main-N-1), the GPU source
    "auto" (NVML, else the simulated GPU), default policies. With --config: that file, with
    --model, --memory-budget and --engine-port applied to its first launched engine.
    """
    from inferctl.controller.config import ConfigError
    from inferctl.controller.up import UP_PORT_FLAGS, RouterSpec, up_config, up_flags

    try:
        model = up_flags(model_arg, model, memory_budget)
        final = up_config(_load(config), from_file=bool(config), replicas=replicas, model=model,
                          memory_budget=memory_budget, engine_port=engine_port, engine_args=list(engine_arg),
                          controller_port=controller_port)
    except ConfigError as exc:
        _die(str(exc), code=2)
    router = RouterSpec(final.listen.host, router_port) if (replicas > 1 if with_router is None else with_router) \
        else None
    _run_config(final, token, engine_log_dir, token_file, tuple(allowed_host), router=router,
                port_flags=UP_PORT_FLAGS)


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
