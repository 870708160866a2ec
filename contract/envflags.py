"""On/off switches read from the environment (``INFERCTL_CPU_KERNELS``, ``INFERCTL_ONEDNN``,
``INFERCTL_HUGEPAGES``): one rule for every switch, the words click's ``BoolParamType`` takes for the
CLI's boolean flags (https://click.palletsprojects.com/en/stable/parameter-types/), any case, spaces
around ignored. Unset or empty: the switch's default.

:func:`switch` raises on any other value, naming the variable and the words it takes, so a typo
(``INFERCTL_ONEDNN=of``) is a clear error where the engine starts (:func:`check_switches`, called by
the engine's CLI) rather than a switch silently left on. Code that reads a switch in the middle of
serving uses :func:`switch_or_default`, which logs the same message once and keeps the default.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping

log = logging.getLogger(__name__)

#: The engine's switches and their defaults (all on).
SWITCHES: dict[str, bool] = {"INFERCTL_CPU_KERNELS": True, "INFERCTL_ONEDNN": True, "INFERCTL_HUGEPAGES": True}

TRUE_WORDS = ("1", "true", "t", "yes", "y", "on")
FALSE_WORDS = ("0", "false", "f", "no", "n", "off")

_warned: set[tuple[str, str]] = set()


def switch(name: str, default: bool = True, environ: Mapping[str, str] | None = None) -> bool:
    """The switch ``name`` from ``environ`` (default ``os.environ``).

    Raises:
        ValueError: the value is none of :data:`TRUE_WORDS` / :data:`FALSE_WORDS` (message names
            ``name``, the value and the words)."""
    raw = (os.environ if environ is None else environ).get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ValueError(f"{name}={raw!r}: must be one of {'/'.join(FALSE_WORDS)} (off) or "
                     f"{'/'.join(TRUE_WORDS)} (on)")


def switch_or_default(name: str, default: bool = True, environ: Mapping[str, str] | None = None) -> bool:
    """:func:`switch`, but a bad value logs its message once (per name and value) and gives ``default``:
    for reads in the middle of serving, which must not fail a request."""
    try:
        return switch(name, default, environ)
    except ValueError as exc:
        key = (name, (os.environ if environ is None else environ).get(name, ""))
        if key not in _warned:
            _warned.add(key)
            log.warning("%s; using the default (%s)", exc, "on" if default else "off")
        return default


def check_switches(environ: Mapping[str, str] | None = None) -> None:
    """Every switch of :data:`SWITCHES` read once.

    Raises:
        ValueError: the first one with a bad value (:func:`switch`'s message)."""
    for name, default in SWITCHES.items():
        switch(name, default, environ)
