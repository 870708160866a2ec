"""Client for inferctl's bundled engine: ``GET /stats`` and the ``/admin/*`` calls.

The ``/stats`` document is specified in docs/architecture.md; this module maps it onto
:class:`~controller.types.EngineSnapshot`. Values that are absent, ``null``, not numbers, or out
of their domain (negative counts, ratios outside 0..1) become ``None``; out-of-domain values are
also listed in ``snapshot.invalid``. Admin calls send ``Authorization: Bearer <admin_token>``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

import httpx
import orjson

from inferctl.contract.precision import check_precision_mode
from inferctl.contract.stats import LATENCY_HISTOGRAM_KEYS
from inferctl.controller.engines.base import EngineAdminError, EngineClient, describe_error, failed_snapshot
from inferctl.controller.engines.promtext import CORE_FIELDS, histogram_from_samples, parse_prometheus_text
from inferctl.controller.scrape.promtext import family_filter
from inferctl.controller.scrape.aio import SCRAPE_ERRORS, AsyncPoller
from inferctl.controller.signals.validation import plain_number
from inferctl.controller.types import EngineSnapshot, engine_snapshot

log = logging.getLogger(__name__)

#: The engine's latency histograms on /metrics (engine/metrics.py ENGINE_METRICS), by snapshot field.
METRIC_HISTOGRAMS = {"ttft_histogram": "inferctl_engine_time_to_first_token_seconds",
                     "itl_histogram": "inferctl_engine_inter_token_latency_seconds",
                     "e2e_histogram": "inferctl_engine_e2e_request_latency_seconds"}
#: The /metrics sample names read (the histograms' parts); the engine's other series are skipped.
_KEEP = family_filter(METRIC_HISTOGRAMS.values())
#: ``requests.latency_histograms`` of ``/stats`` (contract/stats.py ``LatencyHistograms``): key ->
#: snapshot field. The same numbers as the /metrics histograms above, so the snapshot is the same.
STATS_HISTOGRAMS = dict(zip(LATENCY_HISTOGRAM_KEYS, ("ttft_histogram", "itl_histogram", "e2e_histogram")))


def histograms_in_stats(doc: dict[str, Any]) -> bool:
    """Whether a ``/stats`` document carries the latency histograms (``requests.latency_histograms``,
    and ``latency_histograms_by_model`` when the engine serves several models): then ``/metrics``
    is not fetched. An older engine's document lacks them and the client reads ``/metrics``."""
    req = doc.get("requests")
    if not isinstance(req, dict) or "latency_histograms" not in req:
        return False
    models = doc.get("engine", {}).get("models") if isinstance(doc.get("engine"), dict) else None
    return not (isinstance(models, list) and len(models) > 1) or "latency_histograms_by_model" in doc


def loads_stats(body: bytes) -> Any:
    """A ``/stats`` body -> its JSON value: orjson (https://github.com/ijl/orjson; ~8× less CPU
    than ``json.loads`` on a 6 KB ``/stats`` here: 21 vs 174 µs), and the standard library's
    ``json.loads`` for what orjson refuses but Python's ``json`` reads (``NaN``/``Infinity``
    literals, a byte-order mark), so those documents read as before. (orjson reads an integer
    over 64 bits as a float; every number of ``/stats`` is read as a float here anyway.)

    Raises:
        ValueError: the body is not JSON. RecursionError: nested too deeply for ``json``.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)


class BundledEngineClient(EngineClient):
    """The bundled engine at ``base_url`` (e.g. ``http://127.0.0.1:8000``).

    ``admin_token``: bearer token for ``/admin/*`` (the engine's ``INFERCTL_ADMIN_TOKEN``);
    ``None`` sends no Authorization header (the engine will answer 401 if it wants one).
    The TTFT / ITL / e2e histograms come from ``/stats`` (``requests.latency_histograms``: one
    GET per poll). ``scrape_metrics``: for an engine whose ``/stats`` lacks them (an older
    engine, :func:`histograms_in_stats`), read them from ``/metrics`` within what is left of
    ``timeout_s``; a failing ``/metrics`` only leaves the histograms missing (no data). The TTFT
    histogram of every served model (``latency_histograms_by_model``, or
    ``inferctl_engine_time_to_first_token_seconds{model=...}``) goes to ``ttft_histogram_by_model``
    by model name.
    """

    kind = "bundled"

    def __init__(self, name: str, base_url: str, admin_token: str | None = None, *,
                 timeout_s: float = 2.0, scrape_metrics: bool = True,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(name, base_url, timeout_s=timeout_s, transport=transport)
        self._admin_token = admin_token
        self.scrape_metrics = scrape_metrics

    # ------------------------------------------------------------------ polling
    def poll(self, now: float) -> EngineSnapshot:
        started = time.monotonic()
        try:
            resp = self._request("GET", "/stats")
        except httpx.HTTPError as exc:
            return failed_snapshot(self, now, f"GET /stats: {describe_error(exc, self.timeout_s)}")
        snap = self._stats_snapshot(resp.status_code, resp.content, now)
        if snap.ok and self.scrape_metrics and not histograms_in_stats(snap.raw):
            left = self.timeout_s - (time.monotonic() - started)
            if left > 0.05:
                self._add_metric_histograms(snap, left)
            snap.missing = [f for f in CORE_FIELDS if getattr(snap, f) is None]
        return snap

    async def poll_async(self, poller: AsyncPoller, now: float) -> EngineSnapshot:
        """:meth:`poll` on the shared loop and connection pool (``GET /stats``; for an older
        engine, ``/metrics`` within what is left of ``timeout_s``). Never raises."""
        started = time.monotonic()
        try:
            status, body = await poller.get(self.base_url + "/stats", deadline_s=self.timeout_s,
                                            headers=self._headers)
        except SCRAPE_ERRORS as exc:
            return failed_snapshot(self, now, f"GET /stats: {describe_error(exc, self.timeout_s)}")
        snap = await poller.offload(len(body), self._stats_snapshot, status, body, now)
        if snap.ok and self.scrape_metrics and not histograms_in_stats(snap.raw):
            left = self.timeout_s - (time.monotonic() - started)
            if left > 0.05:
                try:
                    status, body = await poller.get(self.base_url + "/metrics", deadline_s=left,
                                                    headers=self._headers)
                except SCRAPE_ERRORS as exc:
                    log.info("engine %s: GET /metrics failed (%s); latency histograms missing", self.name,
                             describe_error(exc, left))
                else:
                    if status == 200:
                        await poller.offload(len(body), self._apply_metrics, snap,
                                             body.decode("utf-8", "replace"))
            snap.missing = [f for f in CORE_FIELDS if getattr(snap, f) is None]
        return snap

    def _stats_snapshot(self, status: int, body: bytes, now: float) -> EngineSnapshot:
        """``GET /stats``'s answer -> a snapshot (a failed one for a non-200 or a body that is
        not a JSON object)."""
        if status != 200:
            return failed_snapshot(self, now, f"GET /stats: HTTP {status}")
        try:
            doc = loads_stats(body)
        except ValueError as exc:
            return failed_snapshot(self, now, f"GET /stats: body is not JSON ({str(exc)[:200]})")
        except RecursionError:
            return failed_snapshot(self, now, "GET /stats: body is not JSON (nested too deeply)")
        if not isinstance(doc, dict):
            return failed_snapshot(self, now, "GET /stats: body is not a JSON object")
        dead = dead_core(doc)
        if dead is not None:     # the server answers, its engine core process does not run: down
            return failed_snapshot(self, now, f"GET /stats: {dead}")
        return snapshot_from_stats(doc, name=self.name, now=now)

    def _add_metric_histograms(self, snap: EngineSnapshot, timeout_s: float) -> None:
        try:
            resp = self._request("GET", "/metrics", timeout_s=timeout_s)
        except httpx.HTTPError as exc:
            log.info("engine %s: GET /metrics failed (%s); latency histograms missing", self.name, exc)
            return
        if resp.status_code != 200:
            return
        self._apply_metrics(snap, resp.text)

    def _apply_metrics(self, snap: EngineSnapshot, text: str) -> None:
        """The latency histograms of a ``/metrics`` text into ``snap`` (fields still missing)."""
        samples, _ = parse_prometheus_text(text, keep=_KEEP)
        # TTFT by served model (the latency breaker judges the main model apart from the light
        # one): inferctl_engine_time_to_first_token_seconds{model=...}
        base = METRIC_HISTOGRAMS["ttft_histogram"]
        names = {base + "_bucket", base + "_sum", base + "_count"}
        by_model: dict[str, list] = {}
        for sample in samples:
            model = sample.labels.get("model")
            if sample.name in names and model:
                by_model.setdefault(model, []).append(sample)
        for model, subset in sorted(by_model.items()):
            hist, invalid = histogram_from_samples(subset, base)
            if hist is not None:
                snap.ttft_histogram_by_model[model] = hist
            snap.invalid.extend(f"{model}: {x}" for x in invalid)
        # /metrics merges every served model: keep the series of the model /stats describes
        samples = [s for s in samples if snap.model is None or s.labels.get("model", snap.model) == snap.model]
        for field, base in METRIC_HISTOGRAMS.items():
            if getattr(snap, field) is None:
                hist, invalid = histogram_from_samples(samples, base)
                setattr(snap, field, hist)
                snap.invalid.extend(invalid)

    # ------------------------------------------------------------------ admin
    def set_precision(self, mode: str, model: str | None = None) -> dict[str, Any]:
        """``POST /admin/precision {"mode"[, "model"]}`` -> e.g. ``{"requested": "int8",
        "current": "full"}``; without ``model`` the engine applies it to every served model.
        Raises ``ValueError`` for a mode other than full/int8, :class:`EngineAdminError` on failure."""
        check_precision_mode(mode, "precision mode")
        return self._admin("/admin/precision", _with_model({"mode": mode}, model))

    def inject_fault(self, kind: str = "oom", count: int = 1, model: str | None = None) -> dict[str, Any]:
        """``POST /admin/fault {"kind", "count"[, "model"]}``: the next ``count`` steps fail with ``kind``."""
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"fault count must be an integer >= 1, got {count!r}")
        return self._admin("/admin/fault", _with_model({"kind": kind, "count": count}, model))

    def drain(self, draining: bool = True, model: str | None = None) -> dict[str, Any]:
        """``POST /admin/drain {"draining"[, "model"]}``: stop (True) or resume (False) admitting."""
        return self._admin("/admin/drain", _with_model({"draining": bool(draining)}, model))

    def route(self, model: str, to: str | None) -> dict[str, Any]:
        """``POST /admin/route {"model", "to"}``: serve requests for ``model`` with model ``to``
        (``None`` clears the route). Used by the latency breaker."""
        return self._admin("/admin/route", {"model": model, "to": to})

    def _admin(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self._admin_token}"} if self._admin_token else {}
        try:
            resp = self._request("POST", path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise EngineAdminError(0, f"{type(exc).__name__}: {exc}", path=path) from exc
        try:
            data = resp.json()
        except ValueError:
            data = None
        if resp.status_code >= 400:
            raise EngineAdminError(resp.status_code, _error_message(data, resp.text), path=path)
        if not isinstance(data, dict):
            raise EngineAdminError(resp.status_code, "response body is not a JSON object", path=path)
        return data


def _with_model(body: dict[str, Any], model: str | None) -> dict[str, Any]:
    if model is not None:
        body["model"] = model
    return body


def _error_message(data: Any, text: str) -> str:
    if isinstance(data, dict):
        for key in ("detail", "error", "message"):
            v = data.get(key)
            if isinstance(v, str):
                return v
            if isinstance(v, dict) and isinstance(v.get("message"), str):
                return v["message"]
            if v is not None:
                return str(v)
    return text.strip()[:500] or "no message"


class _Reader:
    """Typed reads from the /stats document; bad values -> None (+ ``invalid`` when out of domain)."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.invalid: list[str] = []

    def raw(self, *path: str) -> Any:
        node: Any = self.doc
        for p in path:
            if type(node) is not dict and not isinstance(node, dict):
                return None
            node = node.get(p)
        return node

    def num(self, *path: str, ratio: bool = False) -> float | None:
        v = self.raw(*path)
        f = _plain_num(v, ratio)            # the common case first (same result as the checks below)
        if f is not _NOT_PLAIN:
            return f
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.invalid.append(f"{'.'.join(path)}={repr(v)[:80]} (not a number)")
            return None
        f = _finite(v)
        if f is None or f < 0 or (ratio and f > 1.0):
            self.invalid.append(f"{'.'.join(path)}={repr(v)[:80]} (out of range)")
            return None
        return f

    def int_(self, *path: str) -> int | None:
        v = self.num(*path)
        return None if v is None else int(v)

    def num_at(self, sec: dict[str, Any] | None, where: str, key: str, ratio: bool = False) -> float | None:
        """:meth:`num` of ``(where, key)`` with the section ``sec`` (``doc[where]`` when it is a
        dict, else None) already looked up: the same value and the same ``invalid`` entry."""
        f = _plain_num(None if sec is None else sec.get(key), ratio)
        return self.num(where, key, ratio=ratio) if f is _NOT_PLAIN else f

    def int_at(self, sec: dict[str, Any] | None, where: str, key: str) -> int | None:
        """:meth:`int_` of ``(where, key)`` with its section already looked up (:meth:`num_at`)."""
        v = self.num_at(sec, where, key)
        return None if v is None else int(v)

    def section(self, key: str) -> dict[str, Any] | None:
        """``doc[key]`` when it is a dict (what :meth:`raw` walks through), else None."""
        node = self.doc.get(key)
        return node if type(node) is dict or isinstance(node, dict) else None

    def list_of_dicts(self, *path: str) -> list[dict]:
        v = self.raw(*path)
        return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


#: :func:`_plain_num`'s answer for a value its fast path does not decide.
_NOT_PLAIN = object()


def _plain_num(v: Any, ratio: bool) -> Any:
    """The common case of :meth:`_Reader.num`: a JSON float or int in range (``[0, 1]`` with
    ``ratio``) as a float, None for None, else ``_NOT_PLAIN`` (the full checks decide, and record
    what is invalid)."""
    if v is None:
        return None
    return float(v) if plain_number(v, 1.0 if ratio else None) else _NOT_PLAIN


def _finite(v: Any) -> float | None:
    """``v`` as a finite float, or None (NaN, ±Inf, an integer beyond float range)."""
    try:
        f = float(v)
    except (OverflowError, TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


#: Fault record fields (docs/architecture.md ``faults.recent[]``) that are byte counts or counts.
_FAULT_NUMBERS = ("requested_bytes", "free_bytes", "allocated_bytes", "reserved_unallocated_bytes",
                  "total_bytes", "requeued_requests", "fragmentation_ratio", "failed_requests")
_FAULT_STRINGS = ("kind", "message", "precision", "source", "action")


def _clean_fault(f: dict[str, Any], where: str, invalid: list[str]) -> dict[str, Any]:
    """One fault record with each known field of the wrong type or out of range set to None
    (listed in ``invalid``): ``id`` an integer or string, ``time`` a finite number >= 0, the
    byte counts finite >= 0, the words strings. Other fields pass through unchanged."""
    out = dict(f)

    def bad(key: str) -> None:
        invalid.append(f"{where}.{key}={repr(f.get(key))[:80]} (invalid)")
        out[key] = None

    fid = f.get("id")
    if fid is not None and (isinstance(fid, bool) or not isinstance(fid, (int, str))):
        bad("id")
    for key in ("time",) + _FAULT_NUMBERS:
        v = f.get(key)
        if v is None:
            continue
        num = None if isinstance(v, bool) or not isinstance(v, (int, float)) else _finite(v)
        if num is None or num < 0:
            bad(key)
    for key in _FAULT_STRINGS:
        if f.get(key) is not None and not isinstance(f.get(key), str):
            bad(key)
    return out


def _histogram(r: _Reader, *paths: tuple[str, ...]) -> dict[str, Any] | None:
    for path in paths:
        h = r.raw(*path)
        if isinstance(h, dict) and isinstance(h.get("buckets"), list):
            try:
                buckets = [(float(le), float(c)) for le, c in h["buckets"]]
            except (TypeError, ValueError, OverflowError):
                r.invalid.append(f"{'.'.join(path)}.buckets (not [le, count] pairs)")
                return None
            return {"buckets": sorted(buckets), "sum": h.get("sum"), "count": h.get("count"),
                    "metric": ".".join(path)}
    return None


#: The number types a JSON parser gives (``bool`` is not one: ``type(True) is bool``).
_NUMBER_TYPES = frozenset({int, float})


def _increasing_counts(v: Any, strict: bool = False) -> bool:
    """``v`` is a non-empty list of finite numbers >= 0 (``strict``: any finite numbers), in
    non-decreasing (``strict``: increasing) order. C-level checks (``map``, ``sum``, ``sorted``):
    ~10x cheaper than a Python loop over the 27 buckets, for every bundled engine every tick."""
    if type(v) is not list or not v or not _NUMBER_TYPES.issuperset(map(type, v)):
        return False
    try:
        if not math.isfinite(sum(v)):        # a NaN or an infinity makes the sum one (or overflows it)
            return False
    except OverflowError:                    # an integer beyond float range (a 400-digit JSON number)
        return False
    if strict:
        return v == sorted(set(v))
    return v[0] >= 0 and v == sorted(v)


def _finite_nonneg(v: Any) -> bool:
    return type(v) in _NUMBER_TYPES and _finite(v) is not None and v >= 0


def stats_histograms(section: Any, where: str, invalid: list[str]) -> dict[str, dict[str, Any]] | None:
    """A ``latency_histograms`` section (contract/stats.py ``LatencyHistograms``) -> ``{snapshot
    field: {"buckets": [(le, cumulative count)..., (inf, count)], "sum", "count", "metric"}}``,
    the shape (and the ``metric`` name) the same histogram read from ``/metrics`` has. None when
    the section is absent; a malformed part (``le`` not increasing finite numbers, a bucket list
    of another length, counts negative or decreasing, ``count`` below the last bucket, ``sum``
    not a finite number >= 0) is listed in ``invalid`` and left out (no data)."""
    if section is None:
        return None
    le = section.get("le") if isinstance(section, dict) else None
    if not _increasing_counts(le, strict=True):
        invalid.append(f"{where}.le (not increasing finite numbers)")
        return {}
    bounds = list(map(float, le))
    out: dict[str, dict[str, Any]] = {}
    for key, field in STATS_HISTOGRAMS.items():
        h = section.get(key)
        if h is None:
            continue
        buckets = h.get("buckets") if isinstance(h, dict) else None
        count, hsum = (h.get("count"), h.get("sum")) if isinstance(h, dict) else (None, None)
        if (not _increasing_counts(buckets) or len(buckets) != len(bounds)
                or not _finite_nonneg(count) or count < buckets[-1] or not _finite_nonneg(hsum)):
            invalid.append(f"{where}.{key} (not cumulative counts over le with count and sum)")
            continue
        pairs = list(zip(bounds, map(float, buckets)))
        pairs.append((math.inf, float(count)))
        out[field] = {"buckets": pairs, "sum": float(hsum), "count": float(count), "metric": METRIC_HISTOGRAMS[field]}
    return out


def dead_core(doc: dict[str, Any]) -> str | None:
    """Why the engine is down although its server answered ``/stats``: its engine core process
    (``--core-process``) is dead (``engine.core_process.alive`` false; the server then exits for
    a restart), as words; None otherwise."""
    eng = doc.get("engine")
    proc = eng.get("core_process") if isinstance(eng, dict) else None
    if not isinstance(proc, dict) or proc.get("alive") is not False:
        return None
    why = proc.get("error") if isinstance(proc.get("error"), str) else f"exit code {proc.get('exit_code')}"
    return f"the engine core process is dead ({why[:200]})"


def snapshot_from_stats(doc: dict[str, Any], *, name: str, now: float = 0.0) -> EngineSnapshot:
    """Map a bundled engine ``/stats`` document (docs/architecture.md) to an EngineSnapshot."""
    r = _Reader(doc)
    s = engine_snapshot(name, "bundled", True, now, raw=doc)
    # each section looked up once (``_Reader.num_at``); the same values and invalid entries, in
    # the same order, as reading every field by its full path
    eng, mem, kv, sch, req = (r.section("engine"), r.section("memory"), r.section("kv_cache"),
                              r.section("scheduler"), r.section("requests"))
    if eng is not None:
        prec, dr, model = eng.get("precision"), eng.get("draining"), eng.get("model")
        s.precision = prec if isinstance(prec, str) else None
        s.draining = dr if isinstance(dr, bool) else None
        s.model = model if isinstance(model, str) else None
    s.memory_budget_bytes = r.int_at(mem, "memory", "budget_bytes")
    s.memory_allocated_bytes = r.int_at(mem, "memory", "allocated_bytes")
    s.memory_reserved_bytes = r.int_at(mem, "memory", "reserved_bytes")
    s.memory_free_bytes = r.int_at(mem, "memory", "free_bytes")
    s.weights_bytes = r.int_at(mem, "memory", "weights_bytes")
    s.full_weights_bytes = r.int_at(mem, "memory", "full_weights_bytes")
    s.kv_usage_ratio = r.num_at(kv, "kv_cache", "usage_ratio", ratio=True)
    s.kv_waste_ratio = r.num_at(kv, "kv_cache", "waste_ratio", ratio=True)
    s.running = r.int_at(sch, "scheduler", "running")
    s.waiting = r.int_at(sch, "scheduler", "waiting")
    s.preemptions_total = r.num_at(sch, "scheduler", "preemptions_total")
    s.steps_total = r.num_at(sch, "scheduler", "steps_total")
    s.step_sequences_total = r.num_at(sch, "scheduler", "step_sequences_total")
    s.real_tokens_total = r.num_at(sch, "scheduler", "real_tokens_total")
    s.padded_tokens_total = r.num_at(sch, "scheduler", "padded_tokens_total")
    s.finished_total = r.num_at(req, "requests", "finished_total")
    reasons = None if req is None else req.get("by_finish_reason")
    if isinstance(reasons, dict):
        s.by_finish_reason = {str(k): f for k, v in reasons.items()
                              if isinstance(v, (int, float)) and not isinstance(v, bool)
                              and (f := _finite(v)) is not None and f >= 0}
    s.prompt_tokens_total = r.num_at(req, "requests", "prompt_tokens_total")
    s.generation_tokens_total = r.num_at(req, "requests", "completion_tokens_total")
    recent = None if req is None else req.get("recent")
    s.recent_requests = [x for x in recent if isinstance(x, dict)] if isinstance(recent, list) else []
    if req is not None:
        s.ttft_histogram = _histogram(r, ("requests", "ttft_histogram"), ("requests", "ttft_seconds", "histogram"))
        s.e2e_histogram = _histogram(r, ("requests", "e2e_histogram"), ("requests", "e2e_seconds", "histogram"))
        s.itl_histogram = _histogram(r, ("requests", "itl_histogram"), ("requests", "itl_seconds", "histogram"))
    _apply_stats_histograms(s, r, None if req is None else req.get("latency_histograms"))
    faults = r.section("faults")
    s.oom_total = r.num_at(faults, "faults", "oom_total")
    recent = None if faults is None else faults.get("recent")
    s.faults = [_clean_fault(f, f"faults.recent[{i}]", r.invalid)
                for i, f in enumerate(recent if isinstance(recent, list) else []) if isinstance(f, dict)]
    s.invalid = r.invalid
    s.missing = [f for f in CORE_FIELDS if getattr(s, f) is None]
    return s


def _apply_stats_histograms(s: EngineSnapshot, r: _Reader, section: Any) -> None:
    """``requests.latency_histograms`` (``section``: that value, already looked up) into the
    snapshot's histogram fields still missing, the TTFT one also under
    ``ttft_histogram_by_model[model]``; the other served models' TTFT from
    ``latency_histograms_by_model``."""
    own = stats_histograms(section, "requests.latency_histograms", r.invalid)
    for field, hist in (own or {}).items():
        if getattr(s, field) is None:
            setattr(s, field, hist)
    if s.model is not None and own and "ttft_histogram" in own:
        s.ttft_histogram_by_model[s.model] = own["ttft_histogram"]
    others = r.raw("latency_histograms_by_model")
    if isinstance(others, dict):
        for model, section in sorted(others.items()):
            if model == s.model:
                continue
            hists = stats_histograms(section, f"latency_histograms_by_model.{model}", r.invalid)
            if hists and "ttft_histogram" in hists:
                s.ttft_histogram_by_model[str(model)] = hists["ttft_histogram"]
