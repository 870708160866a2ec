"""``inferctl drill oom``: a scripted game day for the OOM → int8 → rollback flow.

Against a running stack (``--url`` of a controller) or one it starts itself (``inferctl up``
with a tight memory budget), the drill:

1. **baseline** — a few clients send short Gutenberg passages (streaming ``/v1/completions``)
   for ``baseline_seconds``; the engine must be in full precision.
2. **pressure** — every client sends long passages (long prompts → long-context prefill
   chunks → bigger step activations) until the engine records an OOM (``/stats``
   ``faults``). A real OOM is the goal; if none comes within ``pressure_seconds`` the drill
   injects one (``POST /admin/fault``, engine admin token) and says so (``oom.source``).
3. **switch** — the controller must see the fault and switch the engine to int8; the load
   goes on for ``int8_seconds`` after the engine reports int8.
4. **recovery** — pressure stops (baseline load only); memory recovers and, after the
   precision policy's hold, the controller rolls back to full precision.
5. **after** — baseline load in full precision for ``after_seconds``; then the load stops and
   every request in flight is waited for.

Every request's outcome is recorded (:class:`RequestRecord`): a non-200 answer, an error
event in the stream, a stream that ends without a finish reason, a transport error or a
request still unanswered at the end are failures (the last kind "lost"). ``/stats``
(engine) is polled every ``poll_seconds``, ``/status`` and ``/events`` (controller) a little
less often.

Measures (:class:`DrillReport`): **switch latency** = the first token received after the
first ``/stats`` answer that reports int8, minus the OOM fault's time (an upper bound: the
switch happened at or before that answer; resolution ~ one poll + one step); also OOM →
degrade decision (controller event) and OOM → int8 reported; **rollback time** = int8
reported → full reported again, and recovery start → full; failed and lost requests;
latency P50/P99 per phase; the controller's events. Output: a live rich view while it runs,
a summary table (or JSON with ``--json``), the full report as JSON and a PNG plot of mode,
memory and latency over time (matplotlib, Agg).

Exit code: 0 when no request failed or was lost, an OOM happened, the engine switched to
int8 and came back to full precision; 1 otherwise; 2 for bad usage.

The drill reaches the engine and the controller over HTTP only; the stack it starts is
``python -m inferctl up`` in a subprocess.

Modules: :mod:`.config` (settings), :mod:`.passages` (the load's texts), :mod:`.report`
(records and the measures), :mod:`.scenario` (the run), :mod:`.stack` (the stack it starts or
finds), :mod:`.view` (rich tables), :mod:`.plot` (the PNG), :mod:`.cli` (the command).
"""

from inferctl.tools.drill.cli import register
from inferctl.tools.drill.config import (PHASES, STORIES_BUDGET, STORIES_ENGINE_ARGS, DrillConfig,
                                         DrillError)
from inferctl.tools.drill.passages import load_passages
from inferctl.tools.drill.plot import plot_report
from inferctl.tools.drill.report import DrillReport, RequestRecord, Sample, percentile
from inferctl.tools.drill.scenario import DrillRun, run_drill
from inferctl.tools.drill.stack import Stack, discover, stack_config, start_stack
from inferctl.tools.drill.view import live_table, summary_table

__all__ = ["PHASES", "STORIES_BUDGET", "STORIES_ENGINE_ARGS", "DrillConfig", "DrillError", "DrillReport",
           "DrillRun", "RequestRecord", "Sample", "Stack", "discover", "live_table", "load_passages",
           "percentile", "plot_report", "register", "run_drill", "stack_config", "start_stack",
           "summary_table"]
