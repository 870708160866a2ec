"""Checks of the launched engine's ``--chat-template`` and ``--api-key`` keys (``engines[].launch``
in the controller's configuration, :class:`inferctl.controller.config.LaunchConfig`).

The controller never imports the engine, so the chat template is checked here the way the
engine reads it (engine/chat_template.py ``resolve_chat_template``): a built-in name, the Jinja
text itself (recognised by ``{{`` or ``{%``, as vLLM's flag), or the path of a file holding it;
the text must compile in Jinja2's sandbox (the engine also test-renders it at its start). The API
key follows :func:`inferctl.contract.http.check_api_key` and reaches the engine as
``$INFERCTL_API_KEY`` (the engine's flag's environment variable), never on its command line,
where ``ps`` would show it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from jinja2 import TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import AfterValidator

from inferctl.contract.http import check_api_key

#: The engine's built-in chat templates (engine/chat_template.py ``CHAT_TEMPLATES``).
BUILTIN_CHAT_TEMPLATES = ("plain", "roles")
#: The environment variable the engine reads its ``--api-key`` from (engine/cli.py).
API_KEY_ENV = "INFERCTL_API_KEY"


def is_template_text(value: str) -> bool:
    """Whether ``value`` is Jinja text rather than a built-in name or a file path."""
    return "{{" in value or "{%" in value


def template_error(text: str) -> str | None:
    """Why ``text`` does not compile as a Jinja template (line and Jinja's words), or None."""
    try:
        ImmutableSandboxedEnvironment().parse(text)
    except TemplateSyntaxError as e:
        return f"the Jinja template does not compile: line {e.lineno}: {e.message}"
    return None


def _chat_template(v: Any) -> Any:
    if v is None or v in BUILTIN_CHAT_TEMPLATES or not is_template_text(v):
        return v      # a file path: checked with the other files (config.check_files)
    why = template_error(v)
    if why is not None:
        raise ValueError(why)
    return v


def chat_template_file_error(value: str | None) -> str | None:
    """Why the launch key ``chat_template`` names no usable template file, or None (not a path,
    or a readable UTF-8 file whose text compiles)."""
    if value is None or value in BUILTIN_CHAT_TEMPLATES or is_template_text(value):
        return None
    p = Path(value)
    if not p.is_file():
        return (f"{value!r} is neither a built-in template ({', '.join(BUILTIN_CHAT_TEMPLATES)}), a file, nor a Jinja"
                " template (text with '{{' or '{%')")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return f"cannot read {p}: {e}"
    why = template_error(text)
    return None if why is None else f"{p}: {why}"


def _api_key(v: Any) -> Any:
    if v is None:
        return None
    try:
        return check_api_key(v, "api_key")
    except ValueError as e:
        raise ValueError(str(e).removeprefix("api_key: ")) from None


#: ``launch.chat_template``: None, a built-in name, Jinja text (compiled at load) or a file path.
ChatTemplateKey = Annotated[str | None, AfterValidator(_chat_template)]
#: ``launch.api_key``: None or a key a client can send as ``Authorization: Bearer <key>``.
ApiKeyKey = Annotated[str | None, AfterValidator(_api_key)]


def launch_env(launch: Any) -> dict[str, str]:
    """The environment the launched engine gets for these keys: ``{INFERCTL_API_KEY: key}`` from
    ``launch.api_key``, else from the variable ``launch.api_key_env`` names (set and non-empty),
    else nothing (``/v1`` open). Raises ``ValueError`` when that variable's value is not a usable key."""
    if launch is None:
        return {}
    key = launch.api_key
    if key is None and launch.api_key_env:
        key = os.environ.get(launch.api_key_env) or None
        if key is not None:
            check_api_key(key, f"${launch.api_key_env} (launch.api_key_env)")
    return {} if key is None else {API_KEY_ENV: key}


def launch_problem(launch: Any) -> tuple[str, str] | None:
    """``(key, why)`` for the first of these launch keys that cannot be used at start (a
    ``chat_template`` file, the key in ``api_key_env``'s variable), else None."""
    if launch is None:
        return None
    why = chat_template_file_error(launch.chat_template)
    if why is not None:
        return "chat_template", why
    try:
        launch_env(launch)
    except ValueError as e:
        return "api_key_env", str(e)
    return None
