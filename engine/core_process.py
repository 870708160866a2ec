"""The engine core in a process of its own (``inferctl engine serve --core-process``).

Why: in one process the stepping thread's Python and the event loop's (HTTP parsing, SSE
rendering, socket writes) take turns on one GIL, so every token's HTTP work delays the next step
(docs/performance.md, "Wave 13" and "Wave 14"). vLLM V1 splits the same way: the engine core
(scheduler, model runner, detokenizer, stop checks, quality signals, the command mailbox) runs
in a child process, the API process keeps HTTP and talks to it over a pipe.

This module is the child's side. :func:`core_main` (run by the process's target, core_boot.boot) builds the engine
from a :class:`CoreSpec`, starts its :class:`~inferctl.engine.async_engine.AsyncLLMEngine`
(stepping thread, unchanged) and answers the API process's messages on its main thread. Every
request is registered with a :class:`_PipeLoop` standing in for an event loop: the stepping
thread's one ``call_soon_threadsafe(_put_all, items)`` per step becomes one ``("out", batch)``
message per step, so the child spends one pickle per step on delivery (about 70 µs for 32
outputs on this project's 2-core host) instead of the API process's per-token work.

The wire (``multiprocessing`` connection: pickled tuples, in order):

API process → core: ``("add", request_id, prompt_token_ids, params, arrival_time, x_request_id)``,
``("abort", request_id)``, ``("abort_all", message)``, ``("post", command_name, fields)`` (a
validated :mod:`~inferctl.engine.commands` command, rebuilt here), ``("call", call_id, name,
args)`` (answered by ``("reply", call_id, ok, value)``; ``name`` in :data:`CALLS`),
``("count", metric, labels, amount)`` (the HTTP layer's error and abort counters live in the
engine's registry), ``("ping",)`` (the API process's watchdog: answered ``("pong",)`` at once by
this process's main thread), ``("shutdown",)``.

core → API process: ``("ready", info)`` once (:func:`model_info`) or ``("failed", exit_code)``;
``("out", [(request_id, item), ...])`` where ``item`` is a
:class:`~inferctl.engine.engine.RequestOutput` or a :class:`PackedError`; ``("state", precision,
requested_precision)`` whenever the precision changes.

The child ignores SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process group: the
API process drains first, then tells the core to stop) and exits when the pipe closes (the API
process died). On Linux it also asks the kernel for SIGKILL when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, prctl(2), first thing: :mod:`inferctl.engine.core_boot`): a
stopped core (SIGSTOP) reads no pipe, and would otherwise outlive a killed server holding its
model's memory.
"""

from __future__ import annotations

import importlib
import logging
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from collections.abc import Callable
from typing import Any

from inferctl.engine import commands
from inferctl.engine.async_engine import AsyncLLMEngine, _put_all
from inferctl.engine.engine import RequestOutput

log = logging.getLogger(__name__)

#: The ``("call", …)`` names the core answers (the API process waits for each reply).
CALLS = frozenset({"stats", "set_draining", "latency_histograms", "metrics"})

#: The commands ``("post", name, fields)`` may rebuild (validated again on construction).
POSTABLE = {c.__name__: c for c in (commands.SwitchPrecision, commands.InjectFault)}


@dataclass(frozen=True)
class PackedError:
    """An exception on the wire: its class (module, qualified name), ``args`` and attributes.
    Exceptions whose ``__init__`` takes other arguments than ``args`` (``AdmissionError``) do not
    survive plain pickling; :meth:`unpack` rebuilds them without calling ``__init__``."""

    module: str
    qualname: str
    args: tuple
    attrs: dict = field(default_factory=dict)

    @classmethod
    def pack(cls, exc: BaseException) -> PackedError:
        """``exc`` as a :class:`PackedError` (attributes that do not pickle are left out)."""
        attrs = {}
        for k, v in getattr(exc, "__dict__", {}).items():
            try:
                pickle.dumps(v)
            except Exception:  # noqa: BLE001 - anything unpicklable stays behind
                continue
            attrs[k] = v
        try:
            args = tuple(exc.args)
            pickle.dumps(args)
        except Exception:  # noqa: BLE001
            args = (str(exc),)
        return cls(type(exc).__module__, type(exc).__qualname__, args, attrs)

    def unpack(self) -> BaseException:
        """The exception again: the same class when it can be imported, else a ``RuntimeError``
        naming it."""
        try:
            obj: Any = importlib.import_module(self.module)
            for part in self.qualname.split("."):
                obj = getattr(obj, part)
            if not (isinstance(obj, type) and issubclass(obj, BaseException)):
                raise TypeError(self.qualname)
            exc = obj.__new__(obj)
            exc.args = self.args
            exc.__dict__.update(self.attrs)
            return exc
        except Exception:  # noqa: BLE001
            return RuntimeError(f"{self.module}.{self.qualname}: {', '.join(map(str, self.args))}")


@dataclass(frozen=True)
class CoreSpec:
    """How the child builds its engine: what ``inferctl engine serve`` does in one process.

    ``model``/``tokenizer``/``device``/``dtype``: as ``--model``, ``--tokenizer``, ``--device``,
    ``--dtype``; ``config``: the :class:`~inferctl.engine.config.EngineConfig` fields except
    ``served_model_name``; ``served_model_name``: the name asked for (None: the bundle's);
    ``clash``: a name the served name must not take (the main model's, for ``--light-model``:
    ``-light`` is appended then); ``precision``: the start precision; ``budget_flag``: the flag
    named in a memory-budget error; ``log_format``/``log_level``: the server's logging."""

    model: str | None
    tokenizer: str | None
    device: str
    dtype: str
    config: dict
    served_model_name: str | None
    precision: str
    clash: str | None = None
    budget_flag: str = "--memory-budget"
    log_format: str = "text"
    log_level: str = "info"
    #: ``builder(spec)`` → the built, not started ``AsyncLLMEngine`` (in the child); a module-level
    #: function, pickled by name: ``engine serve`` passes :func:`inferctl.engine.cli.build_core`.
    builder: Callable[[CoreSpec], AsyncLLMEngine] | None = None

    def build(self) -> AsyncLLMEngine:
        """Load the model and build the engine (in the child), with :attr:`builder`. Raises what
        it raises (``typer.Exit`` with the CLI's exit code, after printing the CLI's message)."""
        if self.builder is None:
            raise ValueError("CoreSpec.builder is not set")
        return self.builder(self)


def model_info(aeng: AsyncLLMEngine) -> dict:
    """What the API process needs from the engine, sent once at start: the numbers of
    :func:`inferctl.engine.entrypoints.state.model_numbers` (tokenizer included), the served
    ``name``, the bundle's ``chat_template`` and BOS/EOS pieces, the precision."""
    from inferctl.engine.entrypoints.state import model_numbers

    llm = aeng.engine
    tok = llm.bundle.tokenizer
    info = model_numbers(llm)
    info.update(name=llm.config.served_model_name or llm.bundle.name,
                chat_template=getattr(llm.bundle, "chat_template", None),
                bos_token=tok.id_to_piece(tok.bos_id), eos_token=tok.id_to_piece(tok.eos_id),
                precision=llm.precision, requested_precision=llm.requested_precision)
    return info


class _RemoteQueue:
    """Stands for a request's :class:`~inferctl.engine.async_engine.OutputQueue` in the child:
    an item delivered alone (an error) is sent at once."""

    __slots__ = ("request_id", "_core")

    def __init__(self, core: EngineCoreProc, request_id: str) -> None:
        self._core, self.request_id = core, request_id

    def deliver(self, item: RequestOutput | BaseException) -> None:
        self._core.send_outputs([(self.request_id, item)])


class _PipeLoop:
    """Stands for the requests' event loop in the child: the stepping thread's
    ``call_soon_threadsafe(_put_all, items)`` sends the step's outputs as one message."""

    def __init__(self, core: EngineCoreProc) -> None:
        self._core = core

    def call_soon_threadsafe(self, fn, *args) -> None:  # noqa: ANN001 - asyncio's signature
        if fn is _put_all:
            self._core.send_outputs([(queue.request_id, out) for queue, out in args[0]])
        else:
            fn(*args)     # _RemoteQueue.deliver(error)


class EngineCoreProc:
    """The child's message loop around a built (not yet started) ``AsyncLLMEngine``."""

    def __init__(self, conn: Connection, aeng: AsyncLLMEngine) -> None:
        self.conn, self.aeng, self.llm = conn, aeng, aeng.engine
        self._send_lock = threading.Lock()
        self._loop = _PipeLoop(self)
        self._calls = ThreadPoolExecutor(2, thread_name_prefix="inferctl-core-call")
        self._state = (self.llm.precision, self.llm.requested_precision)
        apply = self.llm.apply_commands

        def apply_and_report() -> None:      # a precision switch is applied here: tell the API process
            apply()
            state = (self.llm.precision, self.llm.requested_precision)
            if state != self._state:
                self._state = state
                self.send(("state", *state))

        self.llm.apply_commands = apply_and_report

    def send(self, message: tuple) -> None:
        """Send one message (any thread); a closed pipe (the API process is gone) is ignored."""
        with self._send_lock:
            try:
                self.conn.send(message)
            except (OSError, ValueError):
                pass

    def send_outputs(self, batch: list) -> None:
        """``("out", batch)`` with exceptions packed (:class:`PackedError`)."""
        self.send(("out", [(rid, item if isinstance(item, RequestOutput) else PackedError.pack(item))
                           for rid, item in batch]))

    def run(self) -> None:
        """Start the engine, report ready, answer messages until ``shutdown`` or the pipe closes."""
        self.aeng.start()
        self.send(("ready", model_info(self.aeng)))
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "shutdown":
                break
            try:
                getattr(self, "_on_" + message[0])(*message[1:])
            except Exception:  # noqa: BLE001 - one bad message must not stop the core
                log.exception("engine core: message %r failed", message[0])
        self._calls.shutdown(wait=False, cancel_futures=True)
        self.aeng.shutdown()

    def _on_add(self, request_id: str, prompt_token_ids: list[int], params, arrival_time: float | None,
                x_request_id: str | None) -> None:
        try:
            seq = self.llm.make_sequence(request_id, prompt_token_ids, params, arrival_time)
            seq.x_request_id = x_request_id
            self.aeng.register(seq, self._loop, _RemoteQueue(self, request_id))
        except Exception as exc:  # noqa: BLE001 - the request's own error, raised in the API process
            self.send_outputs([(request_id, exc)])

    def _on_ping(self) -> None:
        self.send(("pong",))

    def _on_abort(self, request_id: str) -> None:
        self.aeng.abort(request_id)

    def _on_abort_all(self, message: str) -> None:
        self.aeng.abort_all(message)

    def _on_post(self, name: str, fields: dict) -> None:
        self.llm.post(POSTABLE[name](**fields))

    def _on_count(self, metric: str, labels: dict, amount: float) -> None:
        self.llm.metrics[metric].labels(**labels).inc(amount)

    def _on_call(self, call_id: int, name: str, args: tuple) -> None:
        self._calls.submit(self._answer, call_id, name, args)

    def _answer(self, call_id: int, name: str, args: tuple) -> None:
        try:
            if name not in CALLS:
                raise ValueError(f"unknown call {name!r}")
            if name == "metrics":
                value: Any = list(self.llm.registry.collect())
            else:
                value = getattr(self.aeng, name)(*args)
        except Exception as exc:  # noqa: BLE001 - raised again in the API process
            self.send(("reply", call_id, False, PackedError.pack(exc)))
            return
        self.send(("reply", call_id, True, value))


def core_main(conn: Connection, spec: CoreSpec) -> None:
    """Build, then serve messages (module docstring): what the child process runs once
    :func:`inferctl.engine.core_boot.boot` (its target) tied it to its parent and set SIGINT and
    SIGTERM aside."""
    try:
        from inferctl.contract.logs import configure_logging

        configure_logging(spec.log_format, spec.log_level)   # the server's logging, in this process too
        aeng = spec.build()
    except SystemExit as exc:          # typer.Exit is click's Exit, not SystemExit: both handled
        conn.send(("failed", exc.code if isinstance(exc.code, int) else 1))
        return
    except BaseException as exc:  # noqa: BLE001 - reported, then the child ends
        exit_code = getattr(exc, "exit_code", None)
        if not isinstance(exit_code, int):
            log.exception("engine core failed to start")
            exit_code = 1
        conn.send(("failed", exit_code))
        return
    EngineCoreProc(conn, aeng).run()
