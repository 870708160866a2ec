"""How ``inferctl``'s client commands reach a running controller: where it is (``--url``,
``$INFERCTL_URL``, default ``http://127.0.0.1:8900``), which admin token to send (``--token``,
``--token-file``, ``$INFERCTL_ADMIN_TOKEN``), the checks of the values sent with a request
(``--timeout``, ``--actor``, ``--reason``) and one bounded HTTP call (:func:`_request`: at most
:data:`MAX_ANSWER_BYTES` read, an answer that is not a controller's refused).

Every failure is one line on stderr and exit code 1 (2 for bad usage) through :func:`_die`;
never a traceback. The commands themselves are in ``controller/cli.py`` (and
``controller/cli_run.py`` for ``up`` / ``controller run``).
"""

from __future__ import annotations

import json
import math
import os
import unicodedata
from typing import Any, NoReturn, Optional

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
