"""Help placeholders that say what to type: ``--port PORT``, ``--model PATH``, ``--memory-budget
SIZE``, rather than typer's type names (``--port <int range>``, ``--model <str>``).

:func:`name_placeholders` walks a typer app before click builds it and gives every value option
and argument without an explicit ``metavar`` one from its name (:func:`placeholder`), falling
back on its type (``N`` for integers, ``NUMBER`` for floats, the option's last word for the
rest). Flags (booleans) get none. Arguments show their name only: typer prints an argument as
``NAME <type>``, so each command's click class is swapped for :class:`PlainArgsCommand`, whose
arguments print as ``NAME``. A part that sets its own ``metavar`` keeps it.
"""

from __future__ import annotations

import inspect
from typing import Any

from typer.core import TyperArgument, TyperCommand
from typer.models import ArgumentInfo, OptionInfo

__all__ = ["PlainArgsCommand", "name_placeholders", "placeholder"]

# (words in the option's name, placeholder): the first whose words all occur wins.
_BY_NAME: tuple[tuple[tuple[str, ...], str], ...] = (
    (("token", "file"), "PATH"), (("chat", "template"), "TEMPLATE"), (("served", "name"), "NAME"),
    (("len",), "TOKENS"), (("poll",), "SECONDS"), (("port",), "PORT"), (("url",), "URL"),
    (("controller",), "URL"), (("token",), "TOKEN"), (("budget",), "SIZE"), (("bytes",), "SIZE"),
    (("host",), "HOST"), (("seconds",), "SECONDS"), (("timeout",), "SECONDS"), (("interval",), "SECONDS"),
    (("utilization",), "FRACTION"), (("fraction",), "FRACTION"),
    (("config",), "PATH"), (("dir",), "DIR"), (("root",), "DIR"), (("out",), "PATH"), (("data",), "PATH"),
    (("tokenizer",), "PATH"), (("model",), "PATH"), (("dtype",), "DTYPE"), (("gpu",), "GPU"),
    (("engine", "arg"), "ARG"), (("actor",), "NAME"), (("engine",), "NAME"),
    (("encoding",), "CODEC"), (("level",), "LEVEL"), (("prompt",), "TEXT"), (("reason",), "TEXT"),
    (("seed",), "SEED"), (("chars",), "CHARS"),
)


def placeholder(name: str, annotation: Any, help_text: str | None = None) -> str:
    """The placeholder for a value option called ``name`` (``--max-body-bytes``) of type
    ``annotation``: by name (``PORT``, ``URL``, ``SIZE``, ``PATH``, ``SECONDS`` …), else ``N``
    (int), ``NUMBER`` (float), else the name's last word in capitals. ``help_text`` showing
    ``NAME=URL`` gives that."""
    words = name.lstrip("-").lower().replace("_", "-").split("-")
    if help_text and "NAME=URL" in help_text:
        return "NAME=URL"
    for keys, ph in _BY_NAME:
        if all(k in words for k in keys):
            return ph
    base = getattr(annotation, "__args__", None)
    kinds = set(base) if base else {annotation}
    if kinds & {int, "int"}:
        return "N"
    if kinds & {float, "float"}:
        return "NUMBER"
    return words[-1].upper() or "VALUE"


class PlainArgsCommand(TyperCommand):
    """A typer command whose arguments print as ``NAME`` in help, without typer's ``<type>``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            if type(p) is TyperArgument:
                p.__class__ = _PlainArgument


class _PlainArgument(TyperArgument):
    def display_type_rich(self, ctx: Any) -> str | None:   # typer: "NAME <str>"; here: "NAME"
        return None


def _name_params(callback: Any) -> None:
    if not callable(callback):
        return
    for pname, p in inspect.signature(callback).parameters.items():
        info = p.default
        if not isinstance(info, (OptionInfo, ArgumentInfo)) or info.metavar is not None:
            continue
        ann = p.annotation
        if isinstance(info, ArgumentInfo):
            info.metavar = pname.upper()
            continue
        if ann in (bool, "bool") or isinstance(info.default, bool) or getattr(info, "is_flag", None):
            continue
        decls = [d for d in info.param_decls or () if d.startswith("--")]
        info.metavar = placeholder(decls[0] if decls else pname, _resolve(ann, callback), info.help)


def _resolve(ann: Any, callback: Any) -> Any:
    """A string annotation (``from __future__ import annotations``) as the type, when simple."""
    if not isinstance(ann, str):
        return ann
    text = ann.replace("Optional[", "").replace("]", "").replace(" | None", "").strip()
    return {"int": int, "float": float, "str": str, "bool": bool}.get(text, text)


def name_placeholders(app: Any) -> None:
    """Give every command, group callback and sub-group of the typer ``app`` the placeholders
    above and :class:`PlainArgsCommand` (where the part set no class of its own). In place."""
    if app.registered_callback is not None:
        _name_params(app.registered_callback.callback)
    for cmd in app.registered_commands:
        _name_params(cmd.callback)
        if cmd.cls in (None, TyperCommand):
            cmd.cls = PlainArgsCommand
    for group in app.registered_groups:
        if group.callback is not None:
            _name_params(group.callback)
        if group.typer_instance is not None:
            name_placeholders(group.typer_instance)
