"""LLMEngine: requests in, incremental outputs out, one scheduler step at a time.

The engine owns the model bundle, the memory accountant, the paged KV cache, the block
manager, the scheduler, the runner and the sampler; ``step()`` schedules one batch, runs it,
samples, detokenizes, checks the stop conditions and returns a :class:`RequestOutput` for
every request that produced a token or finished. Not thread-safe: one thread calls it
(:class:`~engine.async_engine.AsyncLLMEngine` is that thread).

Faults. An OOM during a step — ``torch.OutOfMemoryError`` from the accountant's budget, from
an injected fault or from CUDA, or a CUDA error whose code is in ``oom_error_codes`` — never
kills the engine: the step's sequences are re-queued at the front of the waiting queue
(arrival order kept, blocks freed, recomputed later), and the fault is recorded with its
numbers, kind and source. The kind decides what happens next (field case F13):

* ``impossible`` (requested > device total): the request with the largest activation share
  fails at once (finish_reason "error", status 400: it can never fit), no retry;
* ``fragmentation`` (reserved-unallocated ≥ requested): ``empty_cache()``, then retry;
* ``exhaustion``: retry after a backoff of ``min(max, base·2^(k-1))`` for the k-th
  consecutive OOM.

The request blamed for an OOM (largest activation share) counts a retry; past
``max_oom_retries`` it fails with finish_reason "error", status 503 and a retry hint — never
silently dropped. Other step errors fail the step's requests with "error" (status 500).

Precision. ``request_precision("int8"|"full")`` is applied between steps: the weights are
switched (``model.set_precision``), the old weights' memory is freed and the cache emptied
before the new weights are accounted, so int8 frees budget for activations. The KV cache is
untouched, so no request fails.

Prompt logprobs (vLLM's ``prompt_logprobs``, asked for with ``SamplingParams.prompt_logprobs``):
the prefill chunks of such a request compute logits for every token (see
:mod:`engine.runner`); the entries are collected on the sequence across chunks and handed
out once, in the request's first :class:`RequestOutput` (``prompt_logprobs``: ``None`` for
the first prompt token, then ``{token_id: Logprob(logprob, rank)}`` per later token). The
step's activation estimate counts those logits rows and their ``log_softmax``; on CPU
without an explicit budget, the budget is sized for a full ``max_num_batched_tokens`` step
of them. With an explicit budget (or on CUDA) a prompt-logprobs step that does not fit the
headroom kept for the profile step takes the OOM path like any step that does not fit.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from inferctl.engine import __version__
from inferctl.engine.attention import KVCache
from inferctl.engine.block_manager import BlockManager
from inferctl.engine.config import ConfigError, EngineConfig
from inferctl.engine.detokenizer import IncrementalDetokenizer
from inferctl.engine.memory import (MemoryAccountant, OomInfo, classify_error, classify_oom,
                           estimate_step_activation_bytes, format_size, parse_oom_message)
from inferctl.engine.metrics import build_registry
from inferctl.engine.quality import detect_repetition_loop, score_output
from inferctl.engine.runner import ModelRunner
from inferctl.engine.sampler import Sampler, make_generator
from inferctl.engine.sampling_params import SamplingParams, SamplingParamsError
from inferctl.engine.scheduler import AdmissionError, Scheduler
from inferctl.engine.sequence import Logprob, PromptLogprobEntry, Sequence, SequenceStatus
from inferctl.engine.stats import EngineStats

__all__ = ["LLMEngine", "RequestOutput", "AdmissionError", "Logprob"]

_STATUS_BY_REASON = {s.value: s for s in SequenceStatus if s.is_finished}


@dataclass(slots=True)
class RequestOutput:
    """The increment of one request after a step.

    Attributes:
        request_id: the request.
        new_token_ids: token ids generated in this step (usually one; empty on an error or
            abort without a new token).
        new_text: text that became safe to send (stop strings never leak; may be "").
        finished / finish_reason: stop, length, repetition, abort or error.
        logprobs: raw logprob of each new token (natural log; may be NaN/-inf: make it
            JSON-safe with ``engine.quality.json_safe``).
        prompt_tokens / completion_tokens: counts so far.
        top_logprobs: per new token ``{token_id: logprob}`` when the request asked for them.
        error: the error message when finish_reason is "error".
        error_status: the HTTP status that error maps to (400 cannot ever fit, 503 retry
            later, 500 internal), else None.
        prompt_logprobs: only in the first output of a request that asked for them: one
            entry per prompt token, ``None`` for the first, then ``{token_id: Logprob}``
            holding the actual prompt token and the top-k alternatives (natural log; may be
            NaN/-inf: make them JSON-safe). None otherwise.
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    logprobs: list[float]
    prompt_tokens: int
    completion_tokens: int
    top_logprobs: list[dict[int, float]] | None = None
    error: str | None = None
    error_status: int | None = None
    prompt_logprobs: list[PromptLogprobEntry | None] | None = None


#: Below this many weight bytes the engine runs torch with one CPU thread unless
#: ``EngineConfig.num_threads`` says otherwise (see ``LLMEngine.__init__``).
TINY_MODEL_BYTES = 16 * 2**20


def _weights_nbytes(model) -> int:
    """Bytes of the model's parameters in the current precision (0 if it cannot tell)."""
    fn = getattr(model, "weight_bytes", None)
    return int(fn()) if callable(fn) else 0


class LLMEngine:
    """The bundled inference engine (see the module docstring).

    Args:
        bundle: a loaded ``ModelBundle`` (``engine.loader.load_model``); the engine uses its
            model on the device and in the dtype it was loaded with.
        config: :class:`EngineConfig`; ``None`` = defaults.

    Raises:
        ConfigError: a setting conflicts with the model or the memory budget cannot hold
            the weights, one KV block and the profiled step (the message gives the numbers).
    """

    def __init__(self, bundle, config: EngineConfig | None = None):
        model = bundle.model
        cfg = (config or EngineConfig()).resolve(bundle.args.max_seq_len, model.device, model.dtype)
        self.config = cfg
        if cfg.num_threads is not None:
            torch.set_num_threads(cfg.num_threads)
        elif cfg.device == "cpu" and _weights_nbytes(model) < TINY_MODEL_BYTES:
            # A tiny model's per-step matmuls are far too small to split across threads: on the
            # 2-core CI machine, 2 intra-op threads ran stories260K 4-30x slower than 1 thread
            # while anything else used a core (measured, docs/benchmarks.md). Process-wide.
            torch.set_num_threads(1)
        self.bundle = bundle
        self.model = model
        self.tokenizer = bundle.tokenizer
        self.args = bundle.args
        self.model_name = cfg.served_model_name or bundle.name
        self.device = torch.device(cfg.device)
        self._eos_id = getattr(self.tokenizer, "eos_id", None)
        # EOS plus the bundle's own end-of-text ids (BOS for llama2.c checkpoints); ignore_eos
        # turns all of them off.
        self._end_ids = frozenset(
            {i for i in (self._eos_id,) if i is not None} | set(getattr(bundle, "stop_token_ids", ()))
        )
        self._vocab = self.args.vocab_size
        self.started_wall = time.time()

        self.precision = getattr(model, "precision", "full")
        self._requested_precision = self.precision
        self._precision_error: str | None = None
        self._weight_bytes_by_mode = (model.weight_bytes_by_mode()
                                      if hasattr(model, "weight_bytes_by_mode") else {})
        self._plan_memory()

        self.block_manager = BlockManager(self.num_kv_blocks, cfg.block_size)
        self.scheduler = Scheduler(cfg.max_model_len, cfg.max_num_seqs, cfg.max_num_batched_tokens,
                                   self.block_manager)
        self.sampler = Sampler()
        self.runner = ModelRunner(model, self.kv_cache, cfg.block_size, self.accountant, self.sampler)
        self.stats_ = EngineStats(cfg.latency_window, cfg.recent_requests, cfg.recent_faults)
        self.registry, self.metrics = build_registry()
        self._seqs: dict[str, Sequence] = {}
        self._draining = False
        self._consecutive_ooms = 0
        self._backoff_until = 0.0
        self.last_step_idle = True
        self.hardware_errors_total = 0
        self.last_hardware_error: str | None = None
        self._init_metrics()

    # ------------------------------------------------------------------ memory plan
    def _act(self, num_tokens: int, num_logits: int, sum_q_ctx: int, sum_ctx: int,
             num_logprob_rows: int = 0) -> int:
        a = self.args
        return estimate_step_activation_bytes(
            num_tokens, num_logits, sum_q_ctx, sum_ctx, a.dim, a.hidden_dim, a.n_heads,
            a.n_kv_heads, a.vocab_size, torch.empty((), dtype=self.model.dtype).element_size(),
            num_logprob_rows)

    def _plan_memory(self) -> None:
        """Size the budget and the KV pool, allocate both through the accountant.

        The activation headroom kept free is the estimate of vLLM's profile step: one prefill
        of ``max_num_batched_tokens`` tokens. Steps at longer contexts may need more; they
        then run out of budget through the accountant (the OOM path, by design). On CPU
        without an explicit budget, the budget covers the worst step instead: B tokens at
        full context, every row's logits and their ``log_softmax`` (a prompt-logprobs prefill).
        """
        cfg, a, model = self.config, self.args, self.model
        kv_int8 = cfg.kv_cache_dtype == "int8"
        bpb = KVCache.bytes_per_block(a.n_layers, cfg.block_size, a.n_kv_heads, a.head_dim,
                                      model.dtype, kv_int8)
        self.kv_bytes_per_block = bpb
        weights = model.weight_bytes()
        B, S, L = cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.max_model_len
        profile = self._act(B, 1, B * B, B)
        self.profile_activation_bytes = profile
        slack = 4 * 512   # the simulated allocator rounds each allocation up to 512 bytes
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            budget = cfg.memory_budget_bytes or int(cfg.gpu_memory_utilization * total)
            in_use = torch.cuda.memory_allocated(self.device)
            if cfg.num_kv_blocks is not None:
                num_blocks = cfg.num_kv_blocks
            else:
                num_blocks = (budget - in_use - profile) // bpb
        elif cfg.memory_budget_bytes is None:
            num_blocks = cfg.num_kv_blocks or max(1, min(S * -(-L // cfg.block_size),
                                                         cfg.cpu_kv_cache_bytes // bpb))
            worst = self._act(B, B, B * L, min(S, B) * L, num_logprob_rows=B)
            budget = weights + num_blocks * bpb + max(worst, profile) + slack
        else:
            budget = cfg.memory_budget_bytes
            if cfg.num_kv_blocks is not None:
                num_blocks = cfg.num_kv_blocks
            else:
                num_blocks = (budget - weights - profile - slack) // bpb
        if num_blocks < 1:
            raise ConfigError("memory_budget_bytes", (
                f"budget {format_size(budget)} leaves no room for one KV block "
                f"({format_size(bpb)}): weights take {format_size(weights)} and a "
                f"{B}-token step needs {format_size(profile)} of activations; raise the budget "
                "or lower max_num_batched_tokens"))
        self.accountant = MemoryAccountant(budget, self.device)
        try:
            self._weights_handle = self.accountant.allocate(weights, "weights")
            self._kv_handle = self.accountant.allocate(num_blocks * bpb, "kv_cache")
        except torch.OutOfMemoryError as err:
            raise ConfigError("memory_budget_bytes", (
                f"budget {format_size(budget)} cannot hold the weights ({format_size(weights)}) "
                f"and {num_blocks} KV blocks ({format_size(num_blocks * bpb)})")) from err
        self.num_kv_blocks = num_blocks
        try:
            self.kv_cache = KVCache.allocate(a.n_layers, num_blocks, cfg.block_size, a.n_kv_heads,
                                             a.head_dim, model.dtype, self.device, kv_int8=kv_int8)
        except torch.OutOfMemoryError as err:   # CUDA: the device itself could not hold it
            raise ConfigError("num_kv_blocks", (
                f"{num_blocks} KV blocks ({format_size(num_blocks * bpb)}) do not fit on "
                f"{self.device}: {err}")) from err

    # ------------------------------------------------------------------ requests
    def make_sequence(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                      arrival_time: float | None = None) -> Sequence:
        """Validate a request and build its :class:`Sequence` without queueing it.

        Reads only settings, so another thread may call it while ``step()`` runs (the async
        engine does). ``arrival_time`` is epoch seconds (``time.time()``, as vLLM); None = now.
        Raises :class:`AdmissionError`: 503 while draining; 400 for an empty or out-of-vocab
        prompt, a duplicate request id, a bad stop token id, or a size that cannot fit
        (see :meth:`Scheduler.check_admission`).
        """
        try:
            if self._draining:
                raise AdmissionError(503, None, "engine is draining: not admitting new requests; "
                                     "retry on another replica or later")
            if not isinstance(request_id, str) or not request_id:
                raise AdmissionError(400, "request_id", f"must be a non-empty string, got {request_id!r}")
            if request_id in self._seqs:
                raise AdmissionError(400, "request_id", f"request {request_id!r} is already running")
            if not isinstance(params, SamplingParams):
                raise AdmissionError(400, "params", f"must be SamplingParams, got {type(params).__name__}")
            ids = list(prompt_token_ids)
            V = self._vocab
            for t in ids:
                if type(t) is not int or not 0 <= t < V:
                    raise AdmissionError(400, "prompt", f"token id {t!r} is outside the vocabulary [0, {V})")
            for t in params.stop_token_ids:
                if t >= V:
                    raise AdmissionError(400, "stop_token_ids", f"token id {t} is outside the vocabulary [0, {V})")
            max_tokens = self.scheduler.check_admission(len(ids), params.max_tokens)
            plk = params.prompt_logprobs
            if plk is not None and (isinstance(plk, bool) or not isinstance(plk, int)
                                    or not 0 <= plk <= params.limits.max_logprobs):
                raise AdmissionError(400, "prompt_logprobs", f"must be an integer >= 0 and <= "
                                     f"{params.limits.max_logprobs}, got {plk!r}")
        except AdmissionError as err:
            self.stats_.admission_errors_total += 1
            reason = "overloaded" if err.status == 503 else "invalid_request"
            self.metrics["inferctl_engine_request_errors_total"].labels(self.model_name, reason).inc()
            raise
        now_mono, now_wall = time.monotonic(), time.time()
        if arrival_time is None:
            arrival, arrival_wall = now_mono, now_wall
        else:
            arrival, arrival_wall = now_mono - max(0.0, now_wall - arrival_time), arrival_time
        gen = make_generator(params.seed, self.device) if params.seed is not None else None
        detok = IncrementalDetokenizer(self.tokenizer, params.stop, prompt_ids=ids)
        seq = Sequence(request_id, ids, params, max_tokens, arrival, arrival_wall, gen, detok,
                       prompt_logprobs_k=plk)
        seq.stop_token_ids = frozenset(params.stop_token_ids)
        seq.ignore_eos = params.ignore_eos
        seq.repetition_stop = params.repetition_stop or self.config.repetition_stop_default
        return seq

    def enqueue(self, seq: Sequence) -> None:
        """Queue a sequence built by :meth:`make_sequence` (the stepping thread only).
        Raises :class:`AdmissionError` (400) if its id is already running."""
        if seq.request_id in self._seqs:
            raise AdmissionError(400, "request_id", f"request {seq.request_id!r} is already running")
        self._seqs[seq.request_id] = seq
        self.scheduler.add(seq)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> None:
        """Validate and queue a request. Raises :class:`AdmissionError` (see make_sequence)."""
        self.enqueue(self.make_sequence(request_id, prompt_token_ids, params, arrival_time))

    def abort_request(self, request_id: str) -> None:
        """Finish a request with "abort" now, freeing its KV blocks. Unknown ids are ignored."""
        seq = self._seqs.get(request_id)
        if seq is not None:
            self._finish(seq, "abort", time.monotonic())
            self._update_gauges()

    def abort_all(self) -> int:
        """Abort every unfinished request; returns how many."""
        ids = list(self._seqs)
        for rid in ids:
            self.abort_request(rid)
        return len(ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self._seqs)

    # ------------------------------------------------------------------ admin
    def request_precision(self, mode: str) -> None:
        """Ask for precision ``"full"`` or ``"int8"``; applied before the next step.
        Raises ``ValueError`` for another mode."""
        if mode not in ("full", "int8"):
            raise ValueError(f"precision mode must be 'full' or 'int8', got {mode!r}")
        self._requested_precision = mode

    @property
    def requested_precision(self) -> str:
        return self._requested_precision

    def inject_fault(self, kind: str = "oom", count: int = 1) -> None:
        """Make the next ``count`` steps run out of memory for real: the accountant's
        activation reservation raises ``torch.OutOfMemoryError`` (source "injected") and the
        engine handles it like any OOM. Raises ``ValueError`` for another kind or count < 1."""
        if kind != "oom":
            raise ValueError(f"fault kind must be 'oom', got {kind!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be an integer >= 1, got {count!r}")
        self.accountant.inject_oom(count)

    def set_draining(self, draining: bool) -> None:
        """Stop (True) or resume (False) admitting requests; in-flight work continues."""
        self._draining = bool(draining)
        self.metrics["inferctl_engine_draining"].set(1 if self._draining else 0)

    @property
    def draining(self) -> bool:
        return self._draining

    def backoff_remaining(self) -> float:
        """Seconds until the next step may run after an "exhaustion" OOM (0 = now)."""
        return max(0.0, self._backoff_until - time.monotonic())

    def _apply_precision(self) -> None:
        mode, old = self._requested_precision, self.precision
        acct = self.accountant
        acct.free(self._weights_handle)
        acct.empty_cache()
        try:
            self.model.set_precision(mode)
            self._weights_handle = acct.allocate(self.model.weight_bytes(), "weights")
        except Exception as err:   # noqa: BLE001 — the budget's OOM, or the device's (CUDA)
            # Refused, never retried: the weights are accounted again in the precision they
            # are in, so the next step neither frees a stale handle nor re-tries the switch.
            if getattr(self.model, "precision", old) != old:
                self.model.set_precision(old)
            self._weights_handle = acct.allocate(self.model.weight_bytes(), "weights")
            self._requested_precision = old
            need = self._weight_bytes_by_mode.get(mode)
            need_text = f"the weights need {format_size(need)}; " if need is not None else ""
            self._precision_error = f"switch to {mode} refused: {need_text}{type(err).__name__}: {err}"
            return
        self.precision = mode
        self._precision_error = None
        self._weight_bytes_by_mode[mode] = self.model.weight_bytes()
        m = self.metrics
        m["inferctl_engine_precision_switches_total"].labels(mode).inc()
        m["inferctl_engine_precision_mode"].labels("full").set(1 if mode == "full" else 0)
        m["inferctl_engine_precision_mode"].labels("int8").set(1 if mode == "int8" else 0)
        m["inferctl_engine_memory_weights_bytes"].set(acct.bytes_by_tag("weights"))

    # ------------------------------------------------------------------ the step
    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; return the outputs of the requests that advanced.

        Applies a pending precision switch first and waits out an OOM backoff (see
        :meth:`backoff_remaining`). Never raises for a failed forward (see the module doc).
        """
        if self._requested_precision != self.precision:
            self._apply_precision()
        wait = self._backoff_until - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        outputs: list[RequestOutput] = []
        sched = self.scheduler.schedule()
        if sched.preempted:
            self.metrics["inferctl_engine_preemptions_total"].inc(len(sched.preempted))
        self.last_step_idle = sched.is_empty
        if sched.is_empty:
            self._update_gauges()
            return outputs
        t0 = time.monotonic()
        try:
            res = self.runner.execute(sched.scheduled)
        except Exception as exc:   # noqa: BLE001 — a failed forward must never kill the engine
            kind = classify_error(exc, self.config.oom_error_codes)
            if kind == "oom":
                self._handle_oom(exc, sched.scheduled, outputs)
            else:
                self._handle_step_error(exc, kind, sched.scheduled, outputs)
            self._update_gauges()
            return outputs
        self._consecutive_ooms = 0
        now = time.monotonic()
        for seq, n in sched.scheduled:
            seq.num_computed_tokens += n
        for seq, cached, entries in res.prompt_logprobs:
            seq.set_prompt_logprobs(cached, entries)
        if res.sample is not None:
            self._commit_samples(res.sampled, res.sample, now, outputs)
        batch = len(sched.scheduled)
        duration = now - t0
        self.stats_.record_step(batch, res.num_tokens, sched.num_prefill_tokens,
                                sched.num_decode_tokens, duration)
        m = self.metrics
        m["inferctl_engine_steps_total"].inc()
        m["inferctl_engine_step_sequences_total"].inc(batch)
        m["inferctl_engine_step_real_tokens_total"].inc(res.num_tokens)
        if res.sampled:
            m["inferctl_engine_generation_tokens_total"].labels(self.model_name).inc(len(res.sampled))
        if not self._seqs:
            # Idle: hand cached activation segments back (torch.cuda.empty_cache on CUDA), so
            # an idle engine reports its real free memory and no allocator "fragmentation" —
            # the controller's rollback and fragmentation policies read these numbers.
            self.accountant.empty_cache()
        self._update_gauges()
        return outputs

    def _commit_samples(self, sampled: list[Sequence], sample, now: float,
                        outputs: list[RequestOutput]) -> None:
        toks, lps, tops = sample.token_ids, sample.logprobs, sample.top_logprobs
        dead = set(sample.nonfinite_rows) if sample.nonfinite_rows else ()
        end_ids = self._end_ids
        prec = self.precision
        st = self.stats_
        h_ttft = self.m_ttft
        h_itl = self.m_itl
        new_prompt_tokens = 0
        for i, seq in enumerate(sampled):
            tok = toks[i]
            lp = lps[i]
            first = seq.first_token_time is None
            prompt_lps = None
            if seq.prompt_logprobs is not None and not seq.output_token_ids:
                prompt_lps = [None, *seq.prompt_logprobs]
                seq.prompt_logprobs = None
            seq.append_token(tok, lp, now)
            if first:
                ttft = now - seq.arrival_time
                st.ttft.append(ttft)
                h_ttft.observe(ttft)
                new_prompt_tokens += len(seq.prompt_token_ids)
                seq.precision = prec
            else:
                itl = seq.itl[-1]
                st.itl.append(itl)
                h_itl.observe(itl)
                if seq.precision != prec:
                    seq.precision = "mixed"
            top = None
            if tops is not None:
                top = [tops[i]]
                if seq.top_logprobs is None:
                    seq.top_logprobs = []
                seq.top_logprobs.append(tops[i])
            reason = None
            text = ""
            if i in dead:
                reason = "error"
                seq.error = "the model's logits had no finite value (NaN/inf); output stopped"
                seq.error_status = 500
            elif tok in end_ids and not seq.ignore_eos:
                reason = "stop"
            elif tok in seq.stop_token_ids:
                reason = "stop"
            else:
                text, stopped = seq.detokenizer.add(tok)
                if stopped:
                    reason = "stop"
            if reason is None:
                if len(seq.output_token_ids) >= seq.max_tokens:
                    reason = "length"
                elif seq.repetition_stop and detect_repetition_loop(
                        seq.output_token_ids, 1, self.config.repetition_stop_max_ngram,
                        self.config.repetition_stop_min_repeats, self.config.repetition_stop_min_span):
                    reason = "repetition"
            if reason is not None and not seq.detokenizer.stopped:
                text += seq.detokenizer.flush()
            if reason is not None:
                self._finish(seq, reason, now)
            outputs.append(RequestOutput(seq.request_id, [tok], text, reason is not None, reason,
                                         [lp], len(seq.prompt_token_ids), len(seq.output_token_ids),
                                         top, seq.error, seq.error_status, prompt_lps))
        if new_prompt_tokens:
            st.prompt_tokens_total += new_prompt_tokens
            self.metrics["inferctl_engine_prompt_tokens_total"].labels(self.model_name).inc(new_prompt_tokens)

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        """Mark ``seq`` finished, free its blocks, record its stats and metrics."""
        seq.status = _STATUS_BY_REASON[reason]
        seq.finish_time = now
        self.scheduler.finish(seq)
        self._seqs.pop(seq.request_id, None)
        ttft = seq.first_token_time - seq.arrival_time if seq.first_token_time is not None else None
        e2e = now - seq.arrival_time
        quality = score_output(seq.output_token_ids, seq.logprobs, len(seq.prompt_token_ids), reason)
        self.stats_.record_finished(seq.request_id, len(seq.prompt_token_ids), len(seq.output_token_ids),
                                    reason, ttft, e2e, quality, seq.precision, seq.num_preemptions,
                                    seq.error)
        m, name = self.metrics, self.model_name
        m["inferctl_engine_requests_total"].labels(name, reason).inc()
        m["inferctl_engine_e2e_request_latency_seconds"].labels(name).observe(e2e)
        if seq.output_token_ids:   # an output with no token has no quality to score
            bucket = quality.prompt_len_bucket
            m["inferctl_engine_outputs_total"].labels(name, bucket).inc()
            if quality.degenerate:
                m["inferctl_engine_degenerate_outputs_total"].labels(name, bucket).inc()
            for n, v in quality.seq_rep.items():
                if v is not None:
                    m["inferctl_engine_output_repetition_ratio"].labels(name, n).observe(v)
            if quality.perplexity is not None:
                m["inferctl_engine_output_perplexity"].labels(name).observe(quality.perplexity)
            if quality.nonfinite_logprobs:
                m["inferctl_engine_nonfinite_logprobs_total"].inc(quality.nonfinite_logprobs)
        if reason == "error":
            err_reason = "oom" if (seq.error or "").startswith("out of memory") else "internal"
            m["inferctl_engine_request_errors_total"].labels(name, err_reason).inc()

    # ------------------------------------------------------------------ faults
    def _share(self, seq: Sequence, n: int) -> int:
        c = seq.num_computed_tokens
        ctx = c + n
        last_prompt = len(seq.prompt_token_ids) - 1
        if c < last_prompt and seq.wants_prompt_logprobs:   # the runner's all-logits chunk
            return self._act(n, n, n * ctx, ctx, num_logprob_rows=min(ctx, last_prompt) - c)
        return self._act(n, 1, n * ctx, ctx)

    def _handle_oom(self, exc: BaseException, scheduled: list[tuple[Sequence, int]],
                    outputs: list[RequestOutput]) -> None:
        info = getattr(exc, "oom_info", None)
        if info is None:
            try:
                info = parse_oom_message(str(exc))
            except ValueError:
                info = OomInfo(None, None, None, None, None, message=str(exc))
        source = getattr(exc, "oom_source", "cuda")
        kind = classify_oom(info) or "exhaustion"
        now = time.monotonic()
        culprit = max(scheduled, key=lambda sn: (self._share(*sn), sn[0].arrival_time))[0]
        failed: list[tuple[Sequence, str, int]] = []
        req = format_size(info.requested_bytes) if info.requested_bytes is not None else "an unknown size"
        if kind == "impossible":
            action = "reject"
            failed.append((culprit, (
                f"out of memory: a step of this request needs {req}, more than the device's "
                f"total {format_size(info.total_bytes)}; it can never fit — shorten the prompt "
                "or max_tokens"), 400))
        else:
            culprit.oom_retries += 1
            if kind == "fragmentation":
                action = "empty_cache"
                self.accountant.empty_cache()
            else:
                action = "backoff"
                self._consecutive_ooms += 1
                delay = min(self.config.oom_backoff_max_seconds,
                            self.config.oom_backoff_seconds * 2 ** (self._consecutive_ooms - 1))
                self._backoff_until = now + delay
            if culprit.oom_retries > self.config.max_oom_retries:
                free = format_size(info.free_bytes) if info.free_bytes is not None else "unknown"
                failed.append((culprit, (
                    f"out of memory ({kind}) after {self.config.max_oom_retries} retries: a step "
                    f"needed {req}, {free} free at precision {self.precision}; retry later "
                    "(the engine may switch to int8 to free memory) or send a shorter request"),
                    503))
        failed_seqs = {id(s) for s, _, _ in failed}
        requeue = [s for s, _ in scheduled if id(s) not in failed_seqs]
        self.scheduler.requeue(requeue)
        for seq, msg, status in failed:
            seq.error = msg
            seq.error_status = status
            text = seq.detokenizer.flush() if not seq.detokenizer.stopped else ""
            self._finish(seq, "error", now)
            outputs.append(RequestOutput(seq.request_id, [], text, True, "error", [],
                                         len(seq.prompt_token_ids), len(seq.output_token_ids),
                                         None, msg, status))
        self.stats_.record_fault(kind, info, info.message or str(exc), len(requeue), len(failed),
                                 self.precision, source, action)
        self.metrics["inferctl_engine_oom_total"].labels(kind).inc()

    def _handle_step_error(self, exc: BaseException, kind: str,
                           scheduled: list[tuple[Sequence, int]], outputs: list[RequestOutput]) -> None:
        now = time.monotonic()
        msg = f"{kind} error during the step: {type(exc).__name__}: {exc}"
        self.stats_.step_errors_total += 1
        self.stats_.last_step_error = msg
        if kind == "hardware":
            self.hardware_errors_total += 1
            self.last_hardware_error = msg
        for seq, _ in scheduled:
            seq.error = msg
            seq.error_status = 500
            self._finish(seq, "error", now)
            outputs.append(RequestOutput(seq.request_id, [], "", True, "error", [],
                                         len(seq.prompt_token_ids), len(seq.output_token_ids),
                                         None, msg, 500))

    # ------------------------------------------------------------------ metrics and stats
    def _init_metrics(self) -> None:
        m = self.metrics
        self.m_ttft = m["inferctl_engine_time_to_first_token_seconds"].labels(self.model_name)
        self.m_itl = m["inferctl_engine_inter_token_latency_seconds"].labels(self.model_name)
        m["inferctl_engine_memory_budget_bytes"].set(self.accountant.budget_bytes)
        m["inferctl_engine_precision_mode"].labels("full").set(1 if self.precision == "full" else 0)
        m["inferctl_engine_precision_mode"].labels("int8").set(1 if self.precision == "int8" else 0)
        m["inferctl_engine_draining"].set(0)
        for kind in ("fragmentation", "exhaustion", "impossible"):
            m["inferctl_engine_oom_total"].labels(kind)
        self._g = (m["inferctl_engine_num_requests_running"], m["inferctl_engine_num_requests_waiting"],
                   m["inferctl_engine_kv_cache_blocks"].labels("used"),
                   m["inferctl_engine_kv_cache_blocks"].labels("free"),
                   m["inferctl_engine_kv_cache_usage_ratio"], m["inferctl_engine_kv_cache_waste_ratio"],
                   m["inferctl_engine_memory_allocated_bytes"], m["inferctl_engine_memory_reserved_bytes"],
                   m["inferctl_engine_memory_weights_bytes"])
        self._update_gauges()

    def _update_gauges(self) -> None:
        run, wait, used, free, usage, waste, alloc, res, wts = self._g
        bm, sch, acct = self.block_manager, self.scheduler, self.accountant
        run.set(len(sch.running))
        wait.set(len(sch.waiting))
        used.set(bm.num_used_blocks)
        free.set(bm.num_free_blocks)
        usage.set(bm.usage_ratio)
        w = bm.waste_ratio
        waste.set(math.nan if w is None else w)   # NaN: no block used, no data
        alloc.set(acct.allocated_bytes)
        res.set(acct.reserved_bytes)
        wts.set(acct.bytes_by_tag("weights"))

    def stats(self) -> dict:
        """The ``/stats`` document (docs/architecture.md); JSON-ready."""
        cfg, bm, acct = self.config, self.block_manager, self.accountant
        snap = acct.snapshot()
        reserved = snap["reserved_bytes"]
        base = self.stats_.to_dict()
        sched = base["scheduler"]
        sched.update(running=len(self.scheduler.running), waiting=len(self.scheduler.waiting),
                     preemptions_total=self.scheduler.preemptions_total)
        faults = base["faults"]
        faults.update(hardware_errors_total=self.hardware_errors_total,
                      last_hardware_error=self.last_hardware_error,
                      pending_injected=acct.pending_injected_ooms)
        return {
            "engine": {"model": self.model_name, "models": [self.model_name], "device": str(self.device),
                       "precision": self.precision, "requested_precision": self._requested_precision,
                       "precision_error": self._precision_error,
                       "kv_cache_dtype": self.kv_cache.dtype_name, "draining": self._draining,
                       "uptime_seconds": time.time() - self.started_wall, "version": __version__,
                       "max_model_len": cfg.max_model_len, "max_num_seqs": cfg.max_num_seqs,
                       "max_num_batched_tokens": cfg.max_num_batched_tokens,
                       "unfinished_requests": len(self._seqs)},
            "memory": {"budget_bytes": snap["budget_bytes"], "allocated_bytes": snap["allocated_bytes"],
                       "reserved_bytes": reserved, "free_bytes": snap["free_bytes"],
                       "reserved_unallocated_bytes": snap["reserved_unallocated_bytes"],
                       "fragmentation_ratio": (snap["reserved_unallocated_bytes"] / reserved
                                               if reserved > 0 else None),
                       "weights_bytes": snap["weights_bytes"], "kv_pool_bytes": snap["kv_pool_bytes"],
                       "activation_bytes": snap["activation_bytes"],
                       "full_weights_bytes": self._weight_bytes_by_mode.get("full"),
                       "int8_weights_bytes": self._weight_bytes_by_mode.get("int8"),
                       "source": "cuda" if acct.is_cuda else "simulated"},
            "kv_cache": {"block_size": cfg.block_size, "num_blocks": bm.num_blocks,
                         "blocks_used": bm.num_used_blocks, "blocks_free": bm.num_free_blocks,
                         "tokens_stored": bm.tokens_stored, "waste_ratio": bm.waste_ratio,
                         "usage_ratio": bm.usage_ratio, "bytes_per_block": self.kv_bytes_per_block},
            "scheduler": sched,
            "requests": base["requests"],
            "quality": base["quality"],
            "faults": faults,
        }
