"""The controller's Prometheus exporter: gauges and counters from the last readings and the
policies (the catalog is ``controller/metrics.py``; docs/observability.md).

A value of None (no data) removes a gauge's series rather than setting it to 0. Labelled
counters whose series are known in advance are created at 0 when the controller starts, so
that PromQL ``increase()``/``rate()`` see their first event.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping

from inferctl.contract.precision import INT8, PRECISION_MODES
from inferctl.controller import signals as sig
from inferctl.controller.actions import RESTART_REASONS
from inferctl.controller.events import EVENT_KINDS
from inferctl.controller.metrics import CONTROLLER_METRICS
from inferctl.controller.signals.batching import batch_window_values
from inferctl.controller.signals.memo import QualityMemo
from inferctl.controller.signals.validation import plain_number
from inferctl.controller.policies.hardware_state import STANDING_KINDS, standing_faults
from inferctl.controller.reset import OUTCOMES as RESET_OUTCOMES
from inferctl.controller.types import Decision, EngineSnapshot, GpuReading

#: ``kind`` label values of ``inferctl_engine_oom_events_total`` (the engine's fault kinds;
#: ``unknown`` when it gives none).
OOM_KINDS = ("fragmentation", "exhaustion", "impossible", "hardware", "unknown")
_LABELS = {spec["name"]: tuple(spec["labels"]) for spec in CONTROLLER_METRICS}
#: the metrics labelled by ``engine`` alone (:meth:`Exporter.engine_gauge`)
_ENGINE_ONLY = frozenset(name for name, labels in _LABELS.items() if labels == ("engine",))
#: the metrics labelled by ``gpu`` and ``uuid`` alone, in that order (:meth:`Exporter.gpu_gauge`)
_GPU_ONLY = frozenset(name for name, labels in _LABELS.items() if labels == ("gpu", "uuid"))
#: how many fault keys per engine are remembered before the ones no longer reported are dropped
_MAX_SEEN_FAULTS = 10_000
#: the gauges an engine poll sets (:meth:`Exporter.export_engine`), removed when a poll fails:
#: a dead engine's last values are no data, not its state now (``inferctl_engine_up`` says 0)
ENGINE_POLL_GAUGES = frozenset({
    "inferctl_precision_mode", "inferctl_degraded_seconds", "inferctl_kv_cache_usage_ratio",
    "inferctl_kv_cache_waste_ratio", "inferctl_fragmentation_ratio", "inferctl_padding_ratio",
    "inferctl_effective_batch_size", "inferctl_repetition_ratio", "inferctl_degenerate_ratio",
    "inferctl_perplexity"})
#: the per-GPU gauges a GPU reading sets (:meth:`Exporter.export_gpu`; labels start ``gpu``,
#: ``uuid``): removed when the reading fails, and for a GPU a good reading no longer lists
GPU_POLL_GAUGES = frozenset({
    "inferctl_gpu_lost", "inferctl_gpu_memory_total_bytes", "inferctl_gpu_memory_used_bytes",
    "inferctl_gpu_memory_free_bytes", "inferctl_gpu_memory_reserved_bytes", "inferctl_gpu_utilization_ratio",
    "inferctl_gpu_memory_bandwidth_utilization_ratio", "inferctl_gpu_temperature_celsius", "inferctl_gpu_power_watts",
    "inferctl_gpu_ecc_errors", "inferctl_gpu_standing_fault", "inferctl_gpu_mig_memory_total_bytes",
    "inferctl_gpu_mig_memory_used_bytes", "inferctl_gpu_mig_memory_free_bytes"})


class Exporter:
    """Sets the controller's metrics (``metrics``: the controller metrics by name, from
    ``controller.metrics.build_registry()[1]``; a metric absent there is skipped).

    ``counter`` is the signals' ``InvalidSampleCounter`` (exported as invalid samples);
    ``clock`` the time source for a snapshot without a time.
    """

    def __init__(self, metrics: dict, counter: Any = None, clock: Callable[[], float] | None = None) -> None:
        self.metrics = metrics
        self.counter = counter
        self.clock = clock or time.time
        self.seen_faults: dict[str, set] = {}
        self._int8_since: dict[str, float] = {}
        self._invalid_exported: dict[str, int] = {}
        self._gpus_counted: set[str] = set()
        self._mig_seen: dict[str, set[tuple[str, ...]]] = {}
        # labelled children by (metric, label values): ``labels()`` once per series life, and
        # the value last set, so an unchanged gauge costs one dict look-up per poll
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._set: dict[tuple[str, tuple[str, ...]], float] = {}
        self._quality = QualityMemo()
        #: engines whose last poll failed (their poll gauges are removed once, at the failure)
        self._engines_down: set[str] = set()
        #: the (gpu, uuid) pairs of the last good GPU reading; None after a failed one
        self._gpus_present: set[tuple[str, str]] | None = set()

    # ------------------------------------------------------------------ primitives
    def _child(self, name: str, labels: Mapping[str, str]) -> tuple[tuple[str, tuple[str, ...]], Any] | None:
        """(key, labelled child) of metric ``name`` for ``labels``; None when the metric is
        absent. ``labels()`` runs once per series life (cached until the series is removed)."""
        order = _LABELS.get(name)
        if order is None:
            return None
        key = (name, tuple([labels[k] for k in order]))
        child = self._children.get(key)
        if child is None:
            m = self.metrics.get(name)
            if m is None:
                return None
            child = self._children[key] = m.labels(*key[1])
        return key, child

    def zero(self, name: str, **labels: str) -> None:
        """Create a counter's series at 0 (no-op when it exists or the metric is absent)."""
        self._child(name, labels)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` to a counter's series (no-op when the metric is absent)."""
        found = self._child(name, labels)
        if found is not None:
            found[1].inc(amount)

    def gauge(self, name: str, value: float | None, **labels: str) -> None:
        """Set a gauge; None (no data) removes the series rather than reading as 0.

        Only a changed value is written, and a series is removed only when it exists: a poll
        that changes nothing costs a dict look-up per gauge (the hot path at 1,024 engines)."""
        order = _LABELS.get(name)
        if order is None:
            return
        self._put(name, (name, tuple([labels[k] for k in order])), value)

    def engine_gauge(self, name: str, engine: str, value: float | None) -> None:
        """:meth:`gauge` for a metric labelled by ``engine`` alone (most per-engine gauges): the
        series key without the keyword dict and label-order pass (~20 such sets per engine a tick)."""
        if name in _ENGINE_ONLY:
            self._put(name, (name, (engine,)), value)
        else:
            self.gauge(name, value, engine=engine)

    def gpu_gauge(self, name: str, gpu: str, uuid: str, value: float | None) -> None:
        """:meth:`gauge` for a metric labelled by ``gpu`` and ``uuid`` alone (a GPU poll's gauges,
        ~12 per GPU): the series key without the keyword dict and label-order pass."""
        if name in _GPU_ONLY:
            self._put(name, (name, (gpu, uuid)), value)
        else:
            self.gauge(name, value, gpu=gpu, uuid=uuid)

    def _put(self, name: str, key: tuple[str, tuple[str, ...]], value: float | None) -> None:
        """Set (or, for None, remove) the series ``key`` of metric ``name``; unchanged: a look-up."""
        if value is None:
            if self._children.pop(key, None) is not None:
                self._set.pop(key, None)
                try:
                    self.metrics[name].remove(*key[1])
                except KeyError:
                    pass
            return
        v = float(value)
        if self._set.get(key) == v:
            return
        child = self._children.get(key)
        if child is None:
            g = self.metrics.get(name)
            if g is None:
                return
            child = self._children[key] = g.labels(*key[1])
        child.set(v)
        self._set[key] = v

    # ------------------------------------------------------------------ start
    def init_counters(self, jobs: Iterable[str], engine_kinds: Mapping[str, str | None],
                      supervised: Iterable[str], policies: Mapping[str, Mapping[str, Any]]) -> None:
        """Create the labelled counters' known series at 0: events by kind, poll errors by job,
        a bundled engine's precision switches, drains and OOM kinds, a supervised engine's
        restart reasons, and each policy's ``COUNTED_ENTRIES``. GPU reset counters follow once
        the GPUs are known (:meth:`export_gpu`)."""
        supervised = set(supervised)
        for kind in EVENT_KINDS:
            self.zero("inferctl_events_total", kind=kind)
        for job in jobs:
            self.zero("inferctl_poll_errors_total", poller=job)
        for name, kind in engine_kinds.items():
            if kind == "bundled":
                for mode in PRECISION_MODES:
                    self.zero("inferctl_precision_switches_total", engine=name, to=mode)
                self.zero("inferctl_engine_drains_total", engine=name)
                for oom in OOM_KINDS:
                    self.zero("inferctl_engine_oom_events_total", engine=name, kind=oom)
            if name in supervised:
                for reason in RESTART_REASONS:
                    self.zero("inferctl_engine_restarts_total", engine=name, reason=reason)
            for pol in policies.get(name, {}).values():
                for metric in getattr(pol, "COUNTED_ENTRIES", {}).values():
                    self.zero(metric, engine=name)

    # ------------------------------------------------------------------ engines
    def export_engine(self, name: str, snap: EngineSnapshot, prev: EngineSnapshot | None) -> None:
        """An engine poll's gauges (up, precision mode, degraded seconds, KV usage/waste,
        fragmentation, padding, effective batch, repetition, degenerate rate by prompt-length
        bucket, perplexity) and its new OOM faults by kind. ``prev`` is the poll before (the
        batch window). A failed poll sets ``inferctl_engine_up`` to 0 and removes the engine's
        other poll gauges (:data:`ENGINE_POLL_GAUGES`: no data, never the dead engine's last values)."""
        self.engine_gauge("inferctl_engine_up", name, 1.0 if snap.ok else 0.0)
        if not snap.ok:
            if name not in self._engines_down:
                self._engines_down.add(name)
                self._forget_engine(name)
            return
        self._engines_down.discard(name)
        if snap.precision in PRECISION_MODES:
            self._export_precision(name, snap)
        c = self.counter
        put = self._put
        # the plain case of each value (a finite number in range) without its Signal; anything
        # else through the signal function, which counts an invalid sample as before
        put("inferctl_kv_cache_usage_ratio", ("inferctl_kv_cache_usage_ratio", (name,)),
            _ratio(snap.kv_usage_ratio, "kv_cache_usage_ratio", c))
        put("inferctl_kv_cache_waste_ratio", ("inferctl_kv_cache_waste_ratio", (name,)),
            _ratio(snap.kv_waste_ratio, "kv_cache_waste_ratio", c))
        put("inferctl_fragmentation_ratio", ("inferctl_fragmentation_ratio", (name,)),
            _fragmentation(snap.memory_reserved_bytes, snap.memory_allocated_bytes, c))
        padding, batch = batch_window_values(prev, snap, c)
        put("inferctl_padding_ratio", ("inferctl_padding_ratio", (name,)), padding)
        put("inferctl_effective_batch_size", ("inferctl_effective_batch_size", (name,)), batch)
        quality = self._quality.summaries(name, snap.recent_requests, c)   # recomputed when the window changes
        rep = quality.repetition
        put("inferctl_repetition_ratio", ("inferctl_repetition_ratio", (name,)), rep.mean_seq_rep.value)
        for bucket, rate in rep.by_bucket.items():
            put("inferctl_degenerate_ratio", ("inferctl_degenerate_ratio", (name, bucket)), rate.rate)
        put("inferctl_perplexity", ("inferctl_perplexity", (name,)), quality.perplexity.value)
        self._count_faults(name, snap)

    def _forget_engine(self, name: str) -> None:
        """Remove every series of :data:`ENGINE_POLL_GAUGES` labelled ``engine=name`` (the engine
        label comes first in each)."""
        for key in [k for k in self._children if k[0] in ENGINE_POLL_GAUGES and k[1][:1] == (name,)]:
            self._put(key[0], key, None)

    def _export_precision(self, name: str, snap: EngineSnapshot) -> None:
        for mode in PRECISION_MODES:
            self._put("inferctl_precision_mode", ("inferctl_precision_mode", (name, mode)),
                      1.0 if mode == snap.precision else 0.0)
        now = snap.time or self.clock()
        if snap.precision == INT8:
            self._int8_since.setdefault(name, now)
        else:
            self._int8_since.pop(name, None)
        since = self._int8_since.get(name)
        self.engine_gauge("inferctl_degraded_seconds", name, 0.0 if since is None else max(0.0, now - since))

    def _count_faults(self, name: str, snap: EngineSnapshot) -> None:
        """Count each fault the engine reports once, keyed by (time, id)."""
        seen = self.seen_faults.setdefault(name, set())
        current = set()
        for fault in snap.faults:
            if not isinstance(fault, dict):
                continue
            key = _hashable((fault.get("time"), fault.get("id")))
            current.add(key)
            if key in seen:
                continue
            seen.add(key)
            kind = fault.get("kind") if fault.get("kind") in OOM_KINDS[:-1] else "unknown"
            self.inc("inferctl_engine_oom_events_total", engine=name, kind=kind)
        if len(seen) > _MAX_SEEN_FAULTS:      # bounded memory; the faults still reported stay known
            seen.intersection_update(current)

    # ------------------------------------------------------------------ GPUs
    def export_gpu(self, reading: GpuReading) -> None:
        """A GPU poll's gauges: telemetry up, and per GPU lost, memory, utilization,
        temperature, power and ECC counts (a lost GPU's numbers are removed). A failed reading
        removes every GPU's gauges (:data:`GPU_POLL_GAUGES`: no data while telemetry is down, never
        the last values); a GPU a good reading no longer lists loses its gauges too."""
        self.gauge("inferctl_gpu_telemetry_up", 1.0 if reading.ok else 0.0, source=reading.source)
        if not reading.ok:
            if self._gpus_present is not None:
                self._gpus_present = None
                self._forget_gpus(set())
            return
        present = {(str(g.index), g.uuid) for g in reading.gpus.values()}
        if self._gpus_present is not None and not self._gpus_present <= present:
            self._forget_gpus(present)          # only when a GPU went away: no sweep per poll
        self._gpus_present = present
        for g in reading.gpus.values():
            lab = {"gpu": str(g.index), "uuid": g.uuid}
            if g.index is not None and lab["gpu"] not in self._gpus_counted:
                self._gpus_counted.add(lab["gpu"])
                for outcome in RESET_OUTCOMES:
                    self.zero("inferctl_gpu_resets_total", gpu=lab["gpu"], outcome=outcome)
            gi, uuid = lab["gpu"], g.uuid
            self.gpu_gauge("inferctl_gpu_lost", gi, uuid, 1.0 if g.lost else 0.0)
            for metric, value in (("inferctl_gpu_memory_total_bytes", g.memory_total_bytes),
                                  ("inferctl_gpu_memory_used_bytes", g.memory_used_bytes),
                                  ("inferctl_gpu_memory_free_bytes", g.memory_free_bytes),
                                  ("inferctl_gpu_memory_reserved_bytes", g.memory_reserved_bytes),
                                  ("inferctl_gpu_utilization_ratio", g.utilization_ratio),
                                  ("inferctl_gpu_memory_bandwidth_utilization_ratio",
                                   g.memory_bandwidth_utilization_ratio),
                                  ("inferctl_gpu_temperature_celsius", g.temperature_celsius),
                                  ("inferctl_gpu_power_watts", g.power_watts)):
                self.gpu_gauge(metric, gi, uuid, None if g.lost else value)
            self.gauge("inferctl_gpu_ecc_errors", g.ecc_corrected, type="corrected", **lab)
            self.gauge("inferctl_gpu_ecc_errors", g.ecc_uncorrected, type="uncorrected", **lab)
            standing = standing_faults(g)
            for kind in STANDING_KINDS:
                self.gauge("inferctl_gpu_standing_fault", None if g.lost else float(kind in standing), kind=kind, **lab)
            self._export_mig(g, lab)

    def _forget_gpus(self, keep: set[tuple[str, str]]) -> None:
        """Remove the :data:`GPU_POLL_GAUGES` series of every GPU whose (gpu, uuid) is not in ``keep``."""
        for key in [k for k in self._children if k[0] in GPU_POLL_GAUGES and tuple(k[1][:2]) not in keep]:
            self._put(key[0], key, None)
        uuids = {uuid for _, uuid in keep}
        self._mig_seen = {uuid: seen for uuid, seen in self._mig_seen.items() if uuid in uuids}

    def _export_mig(self, g: Any, lab: dict[str, str]) -> None:
        """Per-MIG-instance memory (``inferctl_gpu_mig_memory_*_bytes``), where the source has it;
        instances gone since the last poll are removed."""
        seen = set()
        for m in g.mig_instances:
            mlab = {**lab, "gpu_instance_id": str(m.gpu_instance_id), "profile": m.profile or ""}
            seen.add(tuple(mlab.values()))
            for metric, value in (("inferctl_gpu_mig_memory_total_bytes", m.memory_total_bytes),
                                  ("inferctl_gpu_mig_memory_used_bytes", m.memory_used_bytes),
                                  ("inferctl_gpu_mig_memory_free_bytes", m.memory_free_bytes)):
                self.gauge(metric, value, **mlab)
        for gone in self._mig_seen.get(g.uuid, set()) - seen:
            for metric in ("inferctl_gpu_mig_memory_total_bytes", "inferctl_gpu_mig_memory_used_bytes",
                           "inferctl_gpu_mig_memory_free_bytes"):
                self.gauge(metric, None, **dict(zip(_LABELS[metric], gone)))
        self._mig_seen[g.uuid] = seen

    def count_xids(self, events: Iterable[Mapping[str, Any]]) -> None:
        """``inferctl_gpu_xid_events_total{gpu, xid, action}`` += 1 per new Xid report (as a
        GPU policy counted them after its deduplication)."""
        for ev in events:
            self.inc("inferctl_gpu_xid_events_total", gpu=str(ev.get("gpu_index")),
                     xid=str(ev.get("xid")), action=str(ev.get("action")))

    # ------------------------------------------------------------------ policies
    def export_policies(self, now: float, policies: Mapping[str, Mapping[str, Any]],
                        gpu_policies: Mapping[str, Any], reading: GpuReading | None) -> None:
        """``inferctl_gpu_healthy`` per GPU of a good reading (a GPU policy's ``gpu_state``
        verdict where one gives it, else "not lost"), and every engine policy's ``gauges(now)``
        labelled with its engine."""
        if reading is not None and reading.ok:
            judge = next((p for p in gpu_policies.values() if hasattr(p, "gpu_state")), None)
            for g in reading.gpus.values():
                state = judge.gpu_state(g.uuid) if judge is not None else None
                healthy = (state == "healthy") if state is not None else not g.lost
                self.gpu_gauge("inferctl_gpu_healthy", str(g.index), g.uuid, 1.0 if healthy else 0.0)
            gstates = (judge.state().get("gpus", {}) if judge is not None and hasattr(judge, "state") else {})
            for g in reading.gpus.values():
                rate = (gstates.get(g.uuid) or {}).get("ecc_corrected_per_second")
                self.gpu_gauge("inferctl_gpu_ecc_corrected_errors_per_second", str(g.index), g.uuid, rate)
        for name, pols in policies.items():
            for pol in pols.values():
                gauges = getattr(pol, "gauges", None)
                if gauges is None:
                    continue
                for gv in gauges(now):
                    if gv.labels:
                        self.gauge(gv.name, gv.value, engine=name, **gv.labels)
                    else:
                        self.engine_gauge(gv.name, name, gv.value)

    def count_entry(self, d: Decision, policy: Any) -> None:
        """A transition into a state that ``policy`` counts (``COUNTED_ENTRIES``, e.g. the
        breaker's trips) increments that counter for the decision's target."""
        metric = getattr(policy, "COUNTED_ENTRIES", {}).get(d.to_state or "")
        if metric is not None and d.from_state != d.to_state:
            self.inc(metric, engine=d.target)

    def export_invalid(self) -> None:
        """Bring ``inferctl_invalid_samples_total{signal}`` up to the counter's totals."""
        if self.counter is None or "inferctl_invalid_samples_total" not in self.metrics:
            return
        for signal, count in self.counter.by_signal().items():
            done = self._invalid_exported.get(signal, 0)
            if count > done:
                self.metrics["inferctl_invalid_samples_total"].labels(signal=signal).inc(count - done)
                self._invalid_exported[signal] = count


def _ratio(v: Any, name: str, counter: Any) -> float | None:
    """``signals.validate_ratio(v, name, counter).value``: a plain ratio (a float or int in
    [0, 1], as a float) or None without its Signal; every other case through the signal function
    (invalid, counted)."""
    if v is None:
        return None
    if plain_number(v, 1.0):
        return float(v)
    return sig.validate_ratio(v, name, counter).value


def _fragmentation(reserved: Any, allocated: Any, counter: Any) -> float | None:
    """``signals.fragmentation_ratio(reserved, allocated, counter).value``: the plain case (two
    finite numbers >= 0, reserved > 0, allocated <= reserved) computed here without its Signals,
    the same float; every other case through the signal function (no data, invalid, counted)."""
    if reserved is None and allocated is None:      # an engine that reports neither: no data
        return None
    if plain_number(reserved) and reserved > 0 and plain_number(allocated):
        r, a = float(reserved), float(allocated)
        if a <= r:
            return (r - a) / r
    return sig.fragmentation_ratio(reserved, allocated, counter).value


def _hashable(value: Any) -> Any:
    """``value`` itself when it can be a set member or dict key, else its ``repr`` (a client
    that passed a list or a dict through must not break deduplication)."""
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value
