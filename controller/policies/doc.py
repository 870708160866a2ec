"""docs/policies.md's transition tables, generated from the policies' declared ``TRANSITIONS``.

Each table sits in the doc between ``<!-- transitions:NAME -->`` and ``<!-- /transitions -->``
and lists every ``(state, event) → state`` of that policy in declaration order. Regenerate
with ``python -m inferctl.controller.policies.doc docs/policies.md``; a test checks that the
doc's tables equal the declared ones.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from inferctl.controller.policies.base import Policy
from inferctl.controller.policies.breaker import LatencyBreaker
from inferctl.controller.policies.fragmentation import FragmentationPolicy
from inferctl.controller.policies.hardware import HardwarePolicy
from inferctl.controller.policies.liveness import EngineLiveness, GpuTelemetryLiveness
from inferctl.controller.policies.precision import PrecisionPolicy

#: The documented policies, by their ``NAME``.
POLICIES: dict[str, type[Policy]] = {cls.NAME: cls for cls in (
    PrecisionPolicy, HardwarePolicy, FragmentationPolicy, LatencyBreaker, EngineLiveness,
    GpuTelemetryLiveness)}

_BLOCK = re.compile(r"(<!-- transitions:(\w+) -->\n)(.*?)(<!-- /transitions -->)", re.DOTALL)


def transitions_markdown(cls: type[Policy]) -> str:
    """``cls.TRANSITIONS`` as a Markdown table ``| from | event | to |`` (state values)."""
    rows = ["| from | event | to |", "| --- | --- | --- |"]
    rows += [f"| {frm.value} | `{event}` | {to.value} |"
             for (frm, event), to in cls.TRANSITIONS.items()]
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    """``text`` with every transitions block replaced by the declared table. Raises
    ``KeyError`` for a block naming an unknown policy."""
    return _BLOCK.sub(lambda m: m.group(1) + transitions_markdown(POLICIES[m.group(2)])
                      + m.group(4), text)


def documented(text: str) -> dict[str, str]:
    """The transitions blocks of ``text`` by policy name (their table text as written)."""
    return {m.group(2): m.group(3) for m in _BLOCK.finditer(text)}


def main(argv: list[str] | None = None) -> int:
    """Rewrite the file named by the one argument (docs/policies.md) with the declared tables."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m inferctl.controller.policies.doc docs/policies.md", file=sys.stderr)
        return 2
    path = Path(args[0])
    path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
