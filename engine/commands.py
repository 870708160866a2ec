"""The command mailbox into the stepping thread (vLLM: the engine core's input queue).

Other threads (the HTTP server, the controller's admin calls, the async engine's callers)
never write engine fields: they post a typed command. Each command validates its arguments
once, when it is built (``ValueError`` naming the field), so a command in the mailbox is always
applicable. The engine applies the mailbox between steps (:meth:`LLMEngine.apply_commands`),
in posting order; each command's :attr:`Command.applied` event is set once it has been applied.

Commands: :class:`SwitchPrecision`, :class:`SetDraining`, :class:`InjectFault`,
:class:`AbortRequest`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from inferctl.contract.precision import FULL, check_precision_mode
from inferctl.contract.stats import FAULT_KINDS, FAULT_OOM


@dataclass
class Command:
    """Base of the engine's commands. ``applied`` is set by the stepping thread."""

    applied: threading.Event = field(default_factory=threading.Event, init=False, repr=False,
                                     compare=False)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the command has been applied (or ``timeout`` seconds); True if applied."""
        return self.applied.wait(timeout)


@dataclass
class SwitchPrecision(Command):
    """Switch the weights to ``mode`` (:data:`inferctl.contract.precision.PRECISION_MODES`).

    Raises:
        ValueError: another mode (:func:`inferctl.contract.precision.check_precision_mode`).
    """

    mode: str = FULL

    def __post_init__(self) -> None:
        check_precision_mode(self.mode, "precision mode")


@dataclass
class SetDraining(Command):
    """Stop (True) or resume (False) admitting new requests; in-flight work continues."""

    draining: bool = True

    def __post_init__(self) -> None:
        self.draining = bool(self.draining)


@dataclass
class InjectFault(Command):
    """Make the next ``count`` steps run out of memory for real (``kind`` "oom").

    Raises:
        ValueError: another kind, or ``count`` not an integer >= 1.
    """

    kind: str = FAULT_OOM
    count: int = 1

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {', '.join(FAULT_KINDS)}, got {self.kind!r}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"count must be an integer >= 1, got {self.count!r}")


@dataclass
class AbortRequest(Command):
    """Finish a request with "abort", freeing its KV blocks. Unknown ids are ignored."""

    request_id: str = ""


class CommandMailbox:
    """A thread-safe FIFO of commands.

    ``post`` may be called from any thread; ``take_all`` by the thread that applies them.
    ``on_post`` (optional) is called after each post, e.g. to wake the stepping thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: deque[Command] = deque()
        self.on_post: Callable[[], None] | None = None

    def post(self, command: Command) -> Command:
        """Queue ``command`` (already validated); returns it (its ``wait()`` blocks until applied)."""
        if not isinstance(command, Command):
            raise TypeError(f"not an engine command: {type(command).__name__}")
        with self._lock:
            self._items.append(command)
        hook = self.on_post
        if hook is not None:
            hook()
        return command

    def take_all(self) -> list[Command]:
        """Remove and return every queued command, oldest first."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __bool__(self) -> bool:
        """Whether a command is queued. Lock-free (one atomic read of the deque under the GIL), so
        the engine's per-step check takes no lock; a command posted just after waits for the next step."""
        return bool(self._items)

    def pending_precision(self) -> str | None:
        """The mode of the last queued :class:`SwitchPrecision`, or None."""
        with self._lock:
            for cmd in reversed(self._items):
                if isinstance(cmd, SwitchPrecision):
                    return cmd.mode
        return None
