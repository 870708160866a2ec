"""Value checks of the controller's configuration fields (:mod:`inferctl.controller.config`): URLs,
bind hosts, pause scopes and weekly times. Each raises ``ValueError`` saying what is wrong; pydantic
turns it into the field's error.
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator

from inferctl.contract.hosts import check_bind_host
from inferctl.contract.http import host_name_problem

#: ``listen.host``, ``launch.host``: an IP literal or an RFC 1123 host name (contract/hosts.py)
BindHost = Annotated[str, AfterValidator(lambda v: check_bind_host(v, ""))]
_SCOPE = re.compile(r"^(all|engine:[A-Za-z0-9][A-Za-z0-9_.-]{0,63}|gpu:\d{1,3})$")
#: a maintenance window's ``from``/``to``: HH:MM, 24-hour UTC
HHMM = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")
#: a weekly window's ``days``, in ``datetime.weekday()`` order
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def check_http_url(v: str) -> str:
    """``v`` if it is an ``http://``/``https://`` URL with a host and a valid port (1-65535);
    raises ``ValueError`` saying what is wrong."""
    if not re.match(r"^https?://[^/\s]+", v) or any(c.isspace() for c in v):
        raise ValueError(f"must be an http:// or https:// URL, got {v!r}")
    try:
        parts = urlsplit(v)
        port = parts.port          # ValueError for a port out of range or not a number
    except ValueError as exc:
        raise ValueError(f"{v!r} is not a valid URL ({exc})") from None
    if not parts.hostname:
        raise ValueError(f"{v!r} has no host")
    if port == 0:
        raise ValueError(f"{v!r}: port must be 1-65535")
    bad = host_name_problem(parts.hostname)
    if bad is not None:
        raise ValueError(f"{v!r}: host {parts.hostname[:80]!r} is not a valid host name ({bad})")
    return v


def check_scope(v: str) -> str:
    """A pause scope: ``all``, ``engine:NAME`` or ``gpu:N``; ValueError naming the form otherwise."""
    if not isinstance(v, str) or not _SCOPE.match(v):
        raise ValueError(f"{v!r} is not a scope: all, engine:NAME or gpu:N")
    return v
