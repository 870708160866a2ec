"""LLMEngine: requests in, incremental outputs out, one scheduler step at a time.

The engine owns the model bundle, the memory plan (accountant, paged KV cache), the block
manager, the scheduler, the runner and the sampler. ``step()`` is vLLM's engine-core step:

1. **commands** — apply the mailbox (:mod:`inferctl.engine.commands`: precision switch,
   drain, fault injection, abort), then wait out an OOM backoff;
2. **schedule** — the scheduler picks the batch (chunked prefill mixed with decodes,
   preemption by recompute);
3. **execute** — the runner runs the forward and samples (:mod:`inferctl.engine.runner`); a
   failed forward goes to the fault path (:mod:`inferctl.engine.faults`: an OOM re-queues the
   batch and never kills the engine; another error fails the step's requests);
4. **update** — commit the tokens, detokenize, check the stop conditions
   (:mod:`inferctl.engine.stop`), finish requests, and hand one
   :class:`~inferctl.engine.stats.IterationStats` to both stat loggers (``/stats`` and
   ``/metrics``).

Threads. One thread steps the engine. Other threads never write its fields: the admin
methods (:meth:`LLMEngine.request_precision`, :meth:`~LLMEngine.set_draining`,
:meth:`~LLMEngine.inject_fault`, :meth:`~LLMEngine.abort_request`) validate their arguments
once and post a command. With no stepping thread attached (plain single-threaded use) the
poster applies the mailbox at once, between steps; with one attached
(:class:`~inferctl.engine.async_engine.AsyncLLMEngine`), the stepping thread applies it before
its next step. ``make_sequence`` only reads settings, so any thread may call it.

Precision. A switch frees the old weights' memory and empties the cache before the new weights
are accounted, so int8 frees budget for activations. The KV cache is untouched, so no request
fails. A switch that raises is refused (``precision_error``), never retried.

Prompt logprobs (vLLM's ``prompt_logprobs``): the prefill chunks of such a request compute
logits for every token (see :mod:`inferctl.engine.runner`); the entries are collected on the
sequence across chunks and handed out once, in the request's first :class:`RequestOutput`
(``None`` for the first prompt token, then ``{token_id: Logprob(logprob, rank)}``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from inferctl.contract.stats import FINISH_ABORT, FINISH_ERROR
from inferctl.contract.units import format_size
from inferctl.engine.block_manager import BlockManager
from inferctl.engine.commands import (AbortRequest, Command, CommandMailbox, InjectFault,
                                      SetDraining, SwitchPrecision)
from inferctl.engine.config import EngineConfig
from inferctl.engine.detokenizer import IncrementalDetokenizer
from inferctl.engine.faults import OomHandler, step_error_message
from inferctl.engine.memory_plan import ActivationModel, apply_start_precision, plan_memory, start_weights_bytes
from inferctl.engine.oom import ERROR_OOM, classify_error
from inferctl.engine.quality import score_output
from inferctl.engine.runner import ModelRunner
from inferctl.engine.sampler import Sampler, make_generator
from inferctl.engine.sampling_params import SamplingParams, SamplingParamsError  # noqa: F401
from inferctl.engine.scheduler import AdmissionError, Scheduler
from inferctl.engine.spec_decode import decoder as spec_decoder
from inferctl.engine.sequence import Logprob, PromptLogprobEntry, Sequence, SequenceStatus
from inferctl.engine.stat_loggers import PrometheusStatLogger
from inferctl.engine.stats import (SUCCESS_REASONS, EngineStats, FinishedRequestStats, IterationStats, OomFault,
                                   SchedulerStats, phase_times)
from inferctl.engine.stats_document import build_stats_document, live_numbers, scheduler_stats
from inferctl.engine.stop import (NONFINITE_LOGITS_ERROR, RepetitionStop, limit_stop_reason,
                                  token_stop_reason)

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
        precision: "full", "int8" or "int4", applied before the first step (None: the model's
            current one); see :func:`~inferctl.engine.memory_plan.start_weights_bytes`.

    Raises:
        ConfigError: a setting conflicts with the model, the budget cannot hold the weights, one KV
            block and the profiled step (the message gives the numbers), or int4 fails; ValueError.
    """

    def __init__(self, bundle, config: EngineConfig | None = None, precision: str | None = None):
        model = bundle.model
        start_bytes = start_weights_bytes(model, precision)
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
        self._repetition_stop = RepetitionStop(cfg.repetition_stop_max_ngram,
                                               cfg.repetition_stop_min_repeats,
                                               cfg.repetition_stop_min_span)
        self.started_wall = time.time()

        self.precision = getattr(model, "precision", "full")
        self._precision_error: str | None = None
        self._weight_bytes_by_mode = (model.weight_bytes_by_mode()
                                      if hasattr(model, "weight_bytes_by_mode") else {})
        self.acts = ActivationModel.of(self.args, model.dtype)
        draft = spec_decoder.build_draft(cfg.speculative_config, model)   # sized by the plan
        plan = plan_memory(model, self.args, cfg, self.device, self.acts, draft, start_bytes)
        self.accountant = plan.accountant
        self.kv_cache = plan.kv_cache
        self.num_kv_blocks = plan.num_kv_blocks
        self.kv_bytes_per_block = plan.kv_bytes_per_block
        self.profile_activation_bytes = plan.profile_activation_bytes
        self._weights_handle = plan.weights_handle
        self._kv_handle = plan.kv_handle

        self.block_manager = BlockManager(self.num_kv_blocks, cfg.block_size, cfg.enable_prefix_caching)
        self.scheduler = Scheduler(cfg.max_model_len, cfg.max_num_seqs, cfg.max_num_batched_tokens,
                                   self.block_manager)
        self.sampler = Sampler()
        self.runner = ModelRunner(model, self.kv_cache, cfg.block_size, self.accountant, self.sampler)
        # speculative decoding (engine.spec_decode): None when --speculative-config is not given
        self.spec = spec_decoder.create(cfg.speculative_config, model, self.block_manager, self.sampler,
                                        plan, draft, cfg.max_num_batched_tokens)
        self.oom = OomHandler(cfg.max_oom_retries, cfg.oom_backoff_seconds,
                              cfg.oom_backoff_max_seconds, self.acts)
        # the two views of one accounting: /stats and /metrics
        self.stats_ = EngineStats(cfg.latency_window, cfg.recent_requests, cfg.recent_faults)
        self.prometheus = PrometheusStatLogger(self.model_name, self.accountant.budget_bytes,
                                               live=self._published_stats)
        self.registry, self.metrics = self.prometheus.registry, self.prometheus.metrics
        for pos in range(self.spec.k if self.spec else 0):   # exported at 0: rate() has data from the start
            self.metrics["inferctl_engine_spec_decode_num_accepted_tokens_per_pos_total"].labels(str(pos))
        self.mailbox = CommandMailbox()
        self.step_lock = threading.RLock()
        self._stepping_thread: threading.Thread | None = None
        self._seqs: dict[str, Sequence] = {}
        self._draining = False
        self.last_step_idle = True
        apply_start_precision(self, precision)
        self._live = live_numbers(self)   # what /metrics shows until the first step publishes

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
            reason = "overloaded" if err.status == 503 else "invalid_request"
            self._record(IterationStats(admission_errors=[reason]), live=False)
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
        rs = params.repetition_stop   # the request's true/false wins over the server default
        seq.repetition_stop = self.config.repetition_stop_default if rs is None else rs
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

    def has_unfinished_requests(self) -> bool:
        return bool(self._seqs)

    # ------------------------------------------------------------------ commands
    def attach_stepping_thread(self, thread: threading.Thread | None) -> None:
        """Declare the thread that steps the engine (None: the caller of each method). While
        one is attached, commands posted by other threads wait for its next step boundary."""
        self._stepping_thread = thread

    def post(self, command: Command) -> Command:
        """Queue a validated command (thread-safe); returns it (``command.wait()`` blocks
        until it is applied). Applied at once when no other thread steps the engine."""
        self.mailbox.post(command)
        owner = self._stepping_thread
        if owner is None or owner is threading.current_thread():
            self.apply_commands()
        return command

    def apply_commands(self) -> None:
        """Apply every queued command, in order (between steps: holds the step lock)."""
        if not self.mailbox:   # the common case, every step: a lock-free read, no lock taken
            return
        with self.step_lock:
            commands = self.mailbox.take_all()
            if not commands:
                return
            it = IterationStats()
            for cmd in commands:
                self._apply(cmd, it)
                cmd.applied.set()
            self._record(it)

    def _apply(self, cmd: Command, it: IterationStats) -> None:
        if isinstance(cmd, SwitchPrecision):
            if cmd.mode != self.precision:
                self._switch_precision(cmd.mode, it)
        elif isinstance(cmd, SetDraining):
            self._draining = cmd.draining
        elif isinstance(cmd, InjectFault):
            self.accountant.inject_oom(cmd.count)
        elif isinstance(cmd, AbortRequest):
            seq = self._seqs.get(cmd.request_id)
            if seq is not None:
                self._finish(seq, FINISH_ABORT, time.monotonic(), it)
        else:   # a Command subclass the engine does not know
            raise TypeError(f"unknown engine command {type(cmd).__name__}")

    def abort_request(self, request_id: str) -> None:
        """Finish a request with "abort", freeing its KV blocks. Unknown ids are ignored."""
        self.post(AbortRequest(request_id=request_id))

    def abort_all(self) -> int:
        """Abort every unfinished request; returns how many."""
        ids = list(self._seqs)
        for rid in ids:
            self.abort_request(rid)
        return len(ids)

    def request_precision(self, mode: str) -> None:
        """Ask for precision ``"full"`` or ``"int8"``; applied between steps.
        Raises ``ValueError`` for another mode."""
        self.post(SwitchPrecision(mode=mode))

    @property
    def requested_precision(self) -> str:
        """The mode of the last switch not applied yet, else the current precision."""
        return self.mailbox.pending_precision() or self.precision

    def inject_fault(self, kind: str = "oom", count: int = 1) -> None:
        """Make the next ``count`` steps run out of memory for real: the accountant's
        activation reservation raises ``torch.OutOfMemoryError`` (source "injected") and the
        engine handles it like any OOM. Raises ``ValueError`` for another kind or count < 1."""
        self.post(InjectFault(kind=kind, count=count))

    def set_draining(self, draining: bool) -> None:
        """Stop (True) or resume (False) admitting requests; in-flight work continues."""
        self.post(SetDraining(draining=draining))

    @property
    def draining(self) -> bool:
        return self._draining

    def backoff_remaining(self) -> float:
        """Seconds until the next step may run after an "exhaustion" OOM (0 = now)."""
        return self.oom.backoff_remaining()

    def _switch_precision(self, mode: str, it: IterationStats) -> None:
        old, acct = self.precision, self.accountant
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
            need = self._weight_bytes_by_mode.get(mode)
            need_text = f"the weights need {format_size(need)}; " if need is not None else ""
            self._precision_error = f"switch to {mode} refused: {need_text}{type(err).__name__}: {err}"
            return
        self.precision = mode
        self.block_manager.reset_prefix_cache()   # cached K/V came from the old weights
        self._precision_error = None
        self._weight_bytes_by_mode[mode] = self.model.weight_bytes()
        it.precision_switched_to = mode

    # ------------------------------------------------------------------ the step
    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; return the outputs of the requests that advanced.

        Applies the queued commands first and waits out an OOM backoff (see
        :meth:`backoff_remaining`). Never raises for a failed forward (see the module doc).
        """
        self.apply_commands()
        wait = self.oom.backoff_remaining()
        if wait > 0:
            time.sleep(wait)
        with self.step_lock:
            it = IterationStats()
            outputs: list[RequestOutput] = []
            self._step(it, outputs)
            self._record(it)
        return outputs

    def _step(self, it: IterationStats, outputs: list[RequestOutput]) -> None:
        # schedule (speculative decoding: each decode's draft tokens are reserved in the budget)
        if self.spec:
            self.scheduler.num_speculative_tokens = 0 if self.spec.paused_reason(self.precision) else self.spec.k
        sched = self.scheduler.schedule()
        it.prefix_cache_queries, it.prefix_cache_hits = self.block_manager.pool.take_counters()
        it.num_preempted = len(sched.preempted)
        self.last_step_idle = sched.is_empty
        if sched.is_empty:
            return
        # execute
        t0 = time.monotonic()
        try:
            drafts = (self.spec.propose(sched.scheduled, self.config.max_num_batched_tokens - sched.num_tokens,
                                        self.precision, self.scheduler.running, it) if self.spec else None)
            res = self.runner.execute(sched.scheduled, drafts)
        except Exception as exc:   # noqa: BLE001 — a failed forward must never kill the engine
            self._handle_step_failure(exc, sched.scheduled, it, outputs)
            return
        # update
        self.oom.forward_succeeded()
        now = time.monotonic()
        for seq, n in sched.scheduled:
            seq.num_computed_tokens += n
        for seq, cached, entries in res.prompt_logprobs:
            seq.set_prompt_logprobs(cached, entries)
        spec_tokens = 0
        if res.verify:   # speculative decoding: keep accepted drafts, commit the emitted tokens
            verified = self.spec.verify(res.verify, drafts)
            self.spec.apply(verified, it)
            spec_tokens = self.spec.commit(verified, self._commit_samples, now, it, outputs)
        if res.sample is not None:
            self._commit_samples(res.sampled, res.sample, now, it, outputs)
        it.ran_forward = True
        it.batch_size = len(sched.scheduled)
        it.real_tokens = res.num_tokens
        it.prefill_tokens = sched.num_prefill_tokens
        it.decode_tokens = sched.num_decode_tokens
        it.duration = now - t0
        it.num_generation_tokens = len(res.sampled) + spec_tokens
        if not self._seqs:
            # Idle: hand cached activation segments back (torch.cuda.empty_cache on CUDA), so
            # an idle engine reports its real free memory and no allocator "fragmentation" —
            # the controller's rollback and fragmentation policies read these numbers.
            self.accountant.empty_cache()

    def _commit_samples(self, sampled: list[Sequence], sample, now: float, it: IterationStats,
                        outputs: list[RequestOutput]) -> None:
        toks, lps, tops = sample.token_ids, sample.logprobs, sample.top_logprobs
        dead = set(sample.nonfinite_rows) if sample.nonfinite_rows else ()
        prec = self.precision
        end_ids = self._end_ids
        for i, seq in enumerate(sampled):
            tok, lp = toks[i], lps[i]
            first = seq.first_token_time is None
            prompt_lps = None
            if seq.prompt_logprobs is not None and not seq.output_token_ids:
                prompt_lps = [None, *seq.prompt_logprobs]
                seq.prompt_logprobs = None
            seq.append_token(tok, lp, now)
            if first:
                it.num_prompt_tokens += len(seq.prompt_token_ids)
                seq.precision = prec
            elif seq.precision != prec:
                seq.precision = "mixed"
            top = None
            if tops is not None:
                top = [tops[i]]
                if seq.top_logprobs is None:
                    seq.top_logprobs = []
                seq.top_logprobs.append(tops[i])
            text = ""
            # the stop checks (engine.stop) run only where one can fire: a token outside the end
            # and stop ids of a finite row, below max_tokens without the repetition stop, stops nothing
            if dead or tok in end_ids or tok in seq.stop_token_ids:
                reason = token_stop_reason(tok, nonfinite=i in dead, end_ids=end_ids,
                                           ignore_eos=seq.ignore_eos, stop_token_ids=seq.stop_token_ids)
            else:
                reason = None
            if reason == FINISH_ERROR:
                seq.error = NONFINITE_LOGITS_ERROR
                seq.error_status = 500
            elif reason is None:
                text, stopped = seq.detokenizer.add(tok)
                if stopped:
                    reason = "stop"
                elif seq.repetition_stop or len(seq.output_token_ids) >= seq.max_tokens:
                    reason = limit_stop_reason(seq.output_token_ids, max_tokens=seq.max_tokens,
                                               repetition_stop=seq.repetition_stop, rule=self._repetition_stop)
            if reason is not None and not seq.detokenizer.stopped:
                text += seq.detokenizer.flush()
            if reason is not None:
                self._finish(seq, reason, now, it)
            outputs.append(RequestOutput(seq.request_id, [tok], text, reason is not None, reason,
                                         [lp], len(seq.prompt_token_ids), len(seq.output_token_ids),
                                         top, seq.error, seq.error_status, prompt_lps))

    def _finish(self, seq: Sequence, reason: str, now: float, it: IterationStats) -> None:
        """Mark ``seq`` finished, free its blocks, add its stats to ``it``."""
        seq.status = _STATUS_BY_REASON[reason]
        seq.finish_time = now
        self.scheduler.finish(seq)
        self._seqs.pop(seq.request_id, None)
        ttft = seq.first_token_time - seq.arrival_time if seq.first_token_time is not None else None
        if reason in SUCCESS_REASONS:   # aborted and failed requests stay out of the latency histograms
            if ttft is not None:
                it.ttfts.append(ttft)
            it.itls.extend(seq.itl)
        quality = score_output(seq.output_token_ids, seq.logprobs, len(seq.prompt_token_ids), reason)
        it.finished.append(FinishedRequestStats(
            seq.request_id, reason, len(seq.prompt_token_ids), len(seq.output_token_ids), ttft,
            now - seq.arrival_time, quality, seq.precision, seq.num_preemptions, seq.error,
            *phase_times(seq), seq.x_request_id))

    def _fail(self, seq: Sequence, message: str, status: int, now: float, it: IterationStats,
              outputs: list[RequestOutput], flush: bool) -> None:
        seq.error = message
        seq.error_status = status
        text = seq.detokenizer.flush() if flush and not seq.detokenizer.stopped else ""
        self._finish(seq, FINISH_ERROR, now, it)
        outputs.append(RequestOutput(seq.request_id, [], text, True, FINISH_ERROR, [],
                                     len(seq.prompt_token_ids), len(seq.output_token_ids),
                                     None, message, status))

    def _handle_step_failure(self, exc: BaseException, scheduled: list[tuple[Sequence, int]],
                             it: IterationStats, outputs: list[RequestOutput]) -> None:
        """The fault path (:mod:`inferctl.engine.faults`): an OOM re-queues the batch (or fails
        the blamed request); any other error fails the step's requests with status 500."""
        now = time.monotonic()
        kind = classify_error(exc, self.config.oom_error_codes)
        if kind != ERROR_OOM:
            msg = step_error_message(exc, kind)
            it.step_errors.append(msg)
            if kind == "hardware":
                it.hardware_errors.append(msg)
            for seq, _ in scheduled:
                self._fail(seq, msg, 500, now, it, outputs, flush=False)
            return
        d = self.oom.decide(exc, scheduled, self.precision, self.accountant)
        self.scheduler.requeue(d.requeue)
        for seq, msg, status in d.failed:
            self._fail(seq, msg, status, now, it, outputs, flush=True)
        blamed = d.culprit
        it.ooms.append(OomFault(d.kind, d.info, d.info.message or str(exc), len(d.requeue),
                                len(d.failed), self.precision, d.source, d.action,
                                blamed.request_id if blamed else None, blamed.x_request_id if blamed else None))

    # ------------------------------------------------------------------ stats
    def _scheduler_stats(self) -> SchedulerStats:
        """The live :class:`SchedulerStats`, read now (:mod:`inferctl.engine.stats_document`)."""
        return scheduler_stats(live_numbers(self), self.block_manager)

    def _published_stats(self) -> SchedulerStats:
        """The :class:`SchedulerStats` of the last published step (the ``/metrics`` gauges, at scrape)."""
        return scheduler_stats(self._live, self.block_manager)

    def _record(self, it: IterationStats, live: bool = True) -> None:
        """Hand one :class:`IterationStats` to both stat loggers (``/stats`` and ``/metrics``);
        ``live`` also publishes the live numbers the next scrape's gauges show."""
        if live:
            self._live = live_numbers(self)
        self.stats_.record(None, it)
        self.prometheus.record(None, it)

    def record_step_error(self, message: str) -> None:
        """Count an error raised by a step itself (the async engine's guard), in
        ``scheduler.step_errors_total`` / ``last_step_error``."""
        self._record(IterationStats(step_errors=[message]))

    def stats(self) -> dict:
        """The ``/stats`` document (:class:`inferctl.contract.stats.StatsDocument`,
        docs/architecture.md; :func:`~inferctl.engine.stats_document.build_stats_document`);
        JSON-ready. Taken between steps (holds the step lock)."""
        with self.step_lock:
            return build_stats_document(self)
