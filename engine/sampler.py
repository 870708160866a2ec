"""Token sampling for one engine step: penalties, temperature, top-k, top-p, seeds, logprobs.

Order of processing for each row (the order of Hugging Face ``generate`` and vLLM):

1. non-finite logits: NaN -> -inf, +inf -> the largest float32 (so softmax stays defined);
2. repetition penalty (CTRL, Keskar et al. 2019, "CTRL: A Conditional Transformer Language
   Model for Controllable Generation", section 4.1; implemented as Hugging Face
   ``RepetitionPenaltyLogitsProcessor``): for every token id present in the row's history
   (prompt + output), ``logit / penalty if logit > 0 else logit * penalty``;
3. presence / frequency penalties (OpenAI definition, as vLLM): ``logit -= frequency *
   count + presence * (count > 0)`` over output tokens;
4. greedy rows (temperature < ``GREEDY_TEMPERATURE_EPS``): argmax of the penalized logits;
5. sampled rows: ``softmax(logits / temperature)``; top-k then top-p (nucleus: keep the
   smallest set of most likely tokens whose probability, renormalised over the top-k, sums
   to >= top_p; Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration");
   one inverse-CDF draw over the kept tokens (the most likely token is always kept; a row
   left with no positive finite mass, e.g. every logit penalised to -inf, takes its best
   logit instead, so one request's extreme settings never fail the batch).

Logprobs are "raw logprobs" (vLLM's default ``logprobs_mode="raw_logprobs"``): the
``log_softmax`` of the model's unprocessed logits, before penalties, temperature and
truncation. So a token's logprob says how likely the *model* found it, the same whatever the
request's sampling settings, which is what perplexity (``engine.quality.perplexity``) needs.

Reproducibility: every row is computed row by row (elementwise ops and per-row reductions),
the kept set does not depend on how candidates were ordered or how many were examined, and
the draw uses one uniform from the row's own ``torch.Generator`` (seeded requests) over the
kept probabilities in vocabulary order. So a seeded request yields the same tokens alone or
in any batch. Rows without a generator share the sampler's own generator (one per device).

Cost: the all-greedy batch without penalties or top logprobs takes a fast path before any
other work (:func:`greedy_sample`: argmax + the chosen token's logprob: logsumexp + one gather on
CUDA, torch's fused log_softmax kernel on CPU where it is measured cheaper, see
``raw_logprobs_of``; no finiteness pass over the logits: a non-finite logprob sends the batch to
the general path); the top-k alternatives only when a row asks.
top-k/top-p look at the ``TRUNCATION_CANDIDATES`` most likely tokens (``topk``) and sort the
full row only when the nucleus may lie beyond them. Penalties cost O(sum of history
lengths) per step for the rows that use them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from inferctl.engine.sampling_params import GREEDY_TEMPERATURE_EPS, SamplingParams

_FLOAT32_MAX = torch.finfo(torch.float32).max


@dataclass
class SampleResult:
    """What the sampler chose for each row of the batch.

    Attributes:
        token_ids: the chosen token id of each row (length B).
        logprobs: the chosen token's raw logprob (natural log, <= 0) per row; NaN or -inf when
            the model's logits were non-finite (the caller must make them JSON-safe).
        top_logprobs: None when no row asked for top logprobs; otherwise one dict per row
            ``{token_id: raw logprob}`` with that row's ``params.logprobs`` most likely tokens
            (empty for rows that asked for none or 0).
        nonfinite_rows: rows whose logits had no finite value at all (NaN or -inf
            everywhere). Their token is 0 and meaningless; the engine should finish those
            requests with finish_reason "error".
    """

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[int, float]] | None
    nonfinite_rows: list[int] = field(default_factory=list)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (one per seeded request).

    Raises:
        RuntimeError: from torch when ``seed`` is outside [-2**63, 2**64 - 1] (SamplingParams
            already rejects that).
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def apply_penalties(logits: torch.Tensor, params: list[SamplingParams],
                    token_histories: list[list[int]],
                    prompt_lens: list[int] | None = None) -> torch.Tensor:
    """Return a copy of ``logits`` [B, V] with each row's penalties applied.

    Repetition penalty (CTRL, Keskar et al. 2019; Hugging Face
    ``RepetitionPenaltyLogitsProcessor``): for each token id present in the row's history
    (prompt + output; counted once however often it occurs), ``logit / penalty`` if
    ``logit > 0`` else ``logit * penalty``. Then presence/frequency (OpenAI, vLLM):
    ``logit -= frequency_penalty * count + presence_penalty * (count > 0)`` with counts over
    ``history[prompt_lens[i]:]`` (the whole history when ``prompt_lens`` is None).
    Rows without penalties are returned unchanged.

    Raises:
        ValueError: a history holds a token id outside [0, V).
    """
    out = logits.clone()
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return out
    vocab = out.shape[1]
    device = out.device

    def counts_of(seqs: list[list[int]]) -> torch.Tensor:
        """[len(seqs), V] int64 occurrence counts, via one bincount over row-offset ids.

        ``np.fromiter`` over the chained lists converts Python ints ~8x faster than
        ``torch.tensor`` (about 1 ms for 64k ids on one CPU core).
        """
        lengths = np.fromiter((len(seq) for seq in seqs), dtype=np.int64, count=len(seqs))
        total = int(lengths.sum())
        if total == 0:
            return torch.zeros(len(seqs), vocab, dtype=torch.long, device=device)
        ids = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=total)
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"token_histories holds a token id outside [0, {vocab})")
        ids += np.repeat(np.arange(len(seqs), dtype=np.int64) * vocab, lengths)
        flat = torch.from_numpy(ids).to(device)
        return torch.bincount(flat, minlength=len(seqs) * vocab).view(len(seqs), vocab)

    rep_rows = [i for i in rows if params[i].repetition_penalty != 1.0]
    if rep_rows:
        ridx = torch.tensor(rep_rows, device=device)
        seen = counts_of([token_histories[i] for i in rep_rows]) > 0
        penalty = torch.tensor([params[i].repetition_penalty for i in rep_rows],
                               dtype=out.dtype, device=device).unsqueeze(1)
        x = out[ridx]
        # a zero logit stays zero: 0 * penalty would be NaN for a penalty that is inf in float32
        out[ridx] = torch.where(seen, torch.where(x > 0, x / penalty, torch.where(x < 0, x * penalty, x)), x)
    pf_rows = [i for i in rows
               if params[i].presence_penalty != 0.0 or params[i].frequency_penalty != 0.0]
    if pf_rows:
        outputs = [token_histories[i][(prompt_lens[i] if prompt_lens is not None else 0):]
                   for i in pf_rows]
        counts = counts_of(outputs).to(out.dtype)
        pidx = torch.tensor(pf_rows, device=device)
        freq = torch.tensor([params[i].frequency_penalty for i in pf_rows],
                            dtype=out.dtype, device=device).unsqueeze(1)
        pres = torch.tensor([params[i].presence_penalty for i in pf_rows],
                            dtype=out.dtype, device=device).unsqueeze(1)
        out[pidx] = out[pidx] - freq * counts - pres * (counts > 0).to(out.dtype)
    return out


#: Candidates examined for top-k/top-p: first the 256 most likely tokens, then 16x more, then
#: a full sort (on one CPU core, for 32 rows of a 32k vocabulary: topk 256 ~5 ms, topk 4096
#: ~19 ms, sort ~90 ms).
TRUNCATION_CANDIDATES = 256
TRUNCATION_WIDEN = 16


def top_k_top_p_mask(probs: torch.Tensor, top_k: list[int], top_p: list[float],
                     candidates: int = TRUNCATION_CANDIDATES) -> torch.Tensor:
    """Bool mask [b, V] of the tokens kept by top-k then top-p (vLLM/HF order).

    top-k keeps the k most likely tokens (k <= 0: all); top-p then keeps, of those, the
    smallest most-likely prefix whose probability, renormalised over the top-k tokens, sums
    to >= p (the most likely token is always kept). Only the ``max(candidates, k)`` most
    likely tokens are examined (``topk``); a row whose nucleus may extend past them (top-k
    off and the candidates' mass < top_p) is redone with ``TRUNCATION_WIDEN`` times more,
    and finally with a full sort.
    """
    b, vocab = probs.shape
    device = probs.device
    ks = [min(k, vocab) if k > 0 else vocab for k in top_k]
    width = min(vocab, max([candidates] + [k for k, raw in zip(ks, top_k) if raw > 0]))
    keep = torch.zeros(b, vocab, dtype=torch.bool, device=device)

    def fill(rows: list[int], width: int) -> list[int]:
        ridx = torch.tensor(rows, device=device)
        sub = probs[ridx]
        if width == vocab:
            vals, order = sub.sort(dim=-1, descending=True, stable=True)
        else:
            vals, order = sub.topk(width, dim=-1, sorted=True)
        k_t = torch.tensor([ks[r] for r in rows], device=device).unsqueeze(1)
        in_k = torch.arange(width, device=device).unsqueeze(0) < k_t
        vals = vals * in_k
        # normaliser: the top-k mass (top-k on) or the whole row's mass (top-k off)
        norm = torch.where(k_t < vocab, vals.sum(dim=-1, keepdim=True),
                           sub.sum(dim=-1, keepdim=True))
        before = (vals.cumsum(dim=-1) - vals) / norm
        p_t = torch.tensor([top_p[r] for r in rows], dtype=vals.dtype, device=device)
        # the most likely token is always kept: a top_p that underflows float32 (1e-300 -> 0)
        # would otherwise keep nothing and make the draw fail for the whole batch
        first = torch.arange(width, device=device).unsqueeze(0) == 0
        cand_keep = in_k & ((before < p_t.unsqueeze(1)) | first)
        keep[ridx] = keep[ridx].scatter(1, order, cand_keep)
        # rows whose nucleus may lie beyond the candidates
        covered = vals.sum(dim=-1) / norm.squeeze(1)
        need = (k_t.squeeze(1) >= vocab) & (covered < p_t) if width < vocab else None
        return [] if need is None else [rows[j] for j in need.nonzero().flatten().tolist()]

    redo = list(range(b))
    while redo:
        redo = fill(redo, width)
        width = min(vocab, width * TRUNCATION_WIDEN)
    return keep


#: Block size of the two-level inverse CDF (see :func:`_inverse_cdf`).
CDF_BLOCK = 256


def _first_above(cdf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Index of the first entry of each row of ``cdf`` [b, n] (non-decreasing, float64) that is
    > ``target`` [b]; target is first clamped just below the row's total, so the index is
    valid and its own increment (probability) is > 0."""
    total = cdf[:, -1]
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token index per row with probability ``probs[r, i] / sum(probs[r])``, from uniforms
    ``u`` [b] in [0, 1) (float64).

    Two levels, so that only ``V / CDF_BLOCK + CDF_BLOCK`` values per row are prefix-summed
    (a float64 cumsum over a 32k vocabulary is the costliest step on CPU otherwise): pick the
    block by the cumulative block sums, then the token by the cumulative sum inside that block,
    rescaling the remaining fraction to the block's own total so rounding can never step
    outside it. Zero-probability tokens and blocks are never picked. Falls back to one level
    when V is not a multiple of the block.
    """
    b, vocab = probs.shape
    block = CDF_BLOCK if vocab % CDF_BLOCK == 0 and vocab > CDF_BLOCK else vocab
    if block == vocab:
        cdf = probs.double().cumsum(dim=-1)
        return _first_above(cdf, u * cdf[:, -1])
    blocks = probs.reshape(b, vocab // block, block)
    block_sums = blocks.sum(dim=-1).double()
    block_cdf = block_sums.cumsum(dim=-1)
    target = u * block_cdf[:, -1]
    j = _first_above(block_cdf, target)
    prefix = (block_cdf.gather(1, j.unsqueeze(1)) - block_sums.gather(1, j.unsqueeze(1))
              ).squeeze(1)
    frac = ((target - prefix) / block_sums.gather(1, j.unsqueeze(1)).squeeze(1)).clamp(0.0, 1.0)
    inner = blocks[torch.arange(b, device=probs.device), j].double().cumsum(dim=-1)
    i = _first_above(inner, frac * inner[:, -1])
    return j * block + i


class Sampler:
    """Chooses the next token of every sequence in a batch.

    Args:
        seed: seed of the shared generator used by rows without their own generator; None =
            a non-deterministic seed (``torch.Generator.seed()``).

    The sampler keeps no per-request state; per-request randomness lives in the generators
    the caller passes, and repetition state in ``token_histories``.
    """

    def __init__(self, seed: int | None = None):
        self._seed = seed
        self._shared: dict[str, torch.Generator] = {}

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        gen = self._shared.get(key)
        if gen is None:
            gen = torch.Generator(device=device)
            if self._seed is None:
                gen.seed()
            else:
                gen.manual_seed(self._seed)
            self._shared[key] = gen
        return gen

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        token_histories: list[list[int]],
        prompt_lens: list[int] | None = None,
    ) -> SampleResult:
        """Sample one token per row.

        Args:
            logits: ``[B, V]`` logits (float32; other float dtypes are upcast), on any device.
            params: B sampling parameters, one per row.
            generators: B generators (on ``logits.device``) or None; a row with a generator
                is drawn with it alone (seeded requests).
            token_histories: B lists of token ids already in each sequence, prompt + output;
                used by the penalties only (may be empty lists otherwise).
            prompt_lens: optional B prompt lengths; presence/frequency penalties then count
                only ``history[prompt_len:]`` (the output, as OpenAI/vLLM). When None they
                count the whole history.

        Returns:
            :class:`SampleResult`.

        Raises:
            ValueError: ``logits`` is not 2-D, the list lengths differ from B, or a history
                holds a token id outside [0, V).
        """
        if logits.dim() != 2:
            raise ValueError(f"logits must be 2-D [B, V], got shape {tuple(logits.shape)}")
        batch, vocab = logits.shape
        for name, seq in (("params", params), ("generators", generators),
                          ("token_histories", token_histories)):
            if len(seq) != batch:
                raise ValueError(f"{name} has {len(seq)} entries, logits has {batch} rows")
        if prompt_lens is not None and len(prompt_lens) != batch:
            raise ValueError(f"prompt_lens has {len(prompt_lens)} entries, logits has {batch} rows")
        if batch == 0:
            return SampleResult([], [], None)

        if logits.dtype != torch.float32:
            logits = logits.float()
        if all(p.temperature < GREEDY_TEMPERATURE_EPS and not p.logprobs and not p.has_penalties for p in params):
            fast = greedy_sample(logits)
            if fast is not None:
                if any(p.logprobs is not None for p in params):   # logprobs=0: an empty dict per row
                    fast.top_logprobs = [{} for _ in params]
                return fast
        # One cheap reduction: the sum is NaN/inf iff some logit is (or, harmlessly, when
        # huge finite logits overflow it: the sanitising branch then changes nothing).
        all_finite = bool(torch.isfinite(logits.sum()))

        if all_finite and all(p.is_greedy and not p.has_penalties for p in params):
            tokens = logits.argmax(dim=-1)
            return self._result(tokens, logits, params, [])

        work = logits
        nonfinite_rows: list[int] = []
        if not all_finite:
            work = work.masked_fill(torch.isnan(work), float("-inf")).clamp(max=_FLOAT32_MAX)
            dead = ~torch.isfinite(work).any(dim=-1)
            if bool(dead.any()):
                nonfinite_rows = dead.nonzero().flatten().tolist()
                work = work.masked_fill(dead.unsqueeze(1), 0.0)

        pen_rows = [i for i, p in enumerate(params) if p.has_penalties]
        if pen_rows:
            work = apply_penalties(work, params, token_histories, prompt_lens)

        tokens = torch.zeros(batch, dtype=torch.long, device=logits.device)
        dead_set = set(nonfinite_rows)
        greedy_rows = [i for i, p in enumerate(params) if p.is_greedy and i not in dead_set]
        if greedy_rows:
            idx = torch.tensor(greedy_rows, device=logits.device)
            tokens[idx] = work[idx].argmax(dim=-1)
        sample_rows = [i for i, p in enumerate(params) if not p.is_greedy and i not in dead_set]
        if sample_rows:
            self._sample_rows(work, tokens, sample_rows, params, generators)
        return self._result(tokens, logits, params, nonfinite_rows)

    def _sample_rows(self, work: torch.Tensor, tokens: torch.Tensor, rows: list[int],
                     params: list[SamplingParams], generators: list[torch.Generator | None]
                     ) -> None:
        """Temperature, top-k, top-p and one draw for each row in ``rows``; writes ``tokens``."""
        device = work.device
        idx = torch.tensor(rows, device=device)
        temps = torch.tensor([params[i].temperature for i in rows],
                             dtype=work.dtype, device=device).unsqueeze(1)
        # clamp: +inf (or a huge logit / small temperature) would make softmax NaN
        probs = torch.softmax((work[idx] / temps).clamp(max=_FLOAT32_MAX), dim=-1)
        trunc = [r for r, i in enumerate(rows) if params[i].top_k > 0 or params[i].top_p < 1.0]
        if trunc:
            tidx = torch.tensor(trunc, device=device)
            keep = top_k_top_p_mask(probs[tidx], [params[rows[r]].top_k for r in trunc],
                              [params[rows[r]].top_p for r in trunc])
            probs[tidx] = probs[tidx] * keep
        # A row with no positive finite mass (penalties drove every logit to -inf, or an extreme
        # penalty made one NaN) cannot be drawn from; without this the draw indexes past the row
        # and the step fails for every request in the batch. Such a row takes its best logit.
        total = probs.sum(dim=-1)
        bad = ~(torch.isfinite(total) & (total > 0))
        if bool(bad.any()):
            best = torch.nan_to_num(work[idx][bad], nan=float("-inf")).argmax(dim=-1)
            onehot = torch.zeros_like(probs[bad])
            onehot[torch.arange(onehot.shape[0], device=device), best] = 1.0
            probs[bad] = onehot
        tokens[idx] = self._draw(probs, [generators[i] for i in rows])

    def _draw(self, probs: torch.Tensor, gens: list[torch.Generator | None]) -> torch.Tensor:
        """One inverse-CDF draw per row from (unnormalised) ``probs`` [b, V].

        Each row takes one float64 uniform from its own generator (seeded rows) or from the
        shared one; see :func:`_inverse_cdf`. The result depends only on the row's
        probabilities and its uniform, not on the batch.
        """
        b = probs.shape[0]
        device = probs.device
        u = torch.empty(b, dtype=torch.float64, device=device)
        shared_rows = [r for r, g in enumerate(gens) if g is None]
        if shared_rows:
            u[torch.tensor(shared_rows, device=device)] = torch.rand(
                len(shared_rows), dtype=torch.float64, device=device,
                generator=self._shared_generator(device))
        for r, gen in enumerate(gens):
            if gen is not None:
                u[r] = torch.rand(1, dtype=torch.float64, device=device, generator=gen)[0]
        return _inverse_cdf(probs, u)

    @staticmethod
    def _result(tokens: torch.Tensor, logits: torch.Tensor, params: list[SamplingParams],
                nonfinite_rows: list[int]) -> SampleResult:
        """Raw logprobs of the chosen tokens (and the top-k alternatives where asked) from the
        unprocessed float32 ``logits`` [B, V]; see :func:`raw_logprobs_of`."""
        kmax = max((p.logprobs or 0) for p in params)
        chosen_lp, vals, ids = raw_logprobs_of(logits, tokens, kmax)
        token_list = tokens.tolist()
        lp_list = chosen_lp.tolist()
        top: list[dict[int, float]] | None = None
        if kmax > 0:
            vals_l, ids_l = vals.tolist(), ids.tolist()
            top = []
            for r, p in enumerate(params):
                k = p.logprobs or 0
                top.append({int(t): float(v) for t, v in zip(ids_l[r][:k], vals_l[r][:k])})
        elif any(p.logprobs is not None for p in params):
            top = [{} for _ in params]
        return SampleResult(token_list, [float(v) for v in lp_list], top, nonfinite_rows)


def greedy_sample(logits: torch.Tensor, ops: Any | None = None) -> SampleResult | None:
    """The batch's greedy tokens and their raw logprobs from float32 ``logits`` [B, V], or None
    when some row holds a non-finite logit that makes its logprob non-finite (NaN, +inf, or every
    logit -inf): the caller then takes the general path, which sanitises such rows.

    ``ops`` (``engine.cpu_kernels``' op namespace, on CPU): one C++ call, ``greedy_logprobs``
    (csrc/decode_step.cpp), gives each row's argmax (the first maximal index; a NaN counts as the
    maximum, as ``torch.argmax``) and its logprob read from ATen's own ``log_softmax`` (the same
    float32 value as below, bit for bit), ~5 µs instead of ~25 µs in a batch-1 step (issue 12, wave 9).

    ``argmax`` (the first maximal index, as ``torch.argmax`` and ``numpy.argmax`` document), the
    chosen token's logprob (:func:`raw_logprobs_of`: on CPU one ``log_softmax``, the argmax and the
    gather then read its numpy view, the same numbers with one torch op instead of five), and the
    finiteness test on the Python floats: the argmax token's logprob is ``-log(sum(exp(x - max)))``,
    which lies in ``[-log V, 0]`` when the row is finite (its own term is 1), so the sum over rows is
    finite exactly when every row's is. A row with some ``-inf`` logits and the rest finite (a masked
    vocabulary) stays on this path: the general one would choose the same token and logprob.
    """
    if ops is not None and logits.device.type == "cpu" and not logits.requires_grad:
        return greedy_from_pairs(ops.greedy_logprobs(logits).tolist())
    if logits.device.type == "cpu" and not logits.requires_grad:
        # One torch op: the log_softmax raw_logprobs_of runs on CPU; the argmax and the gather on
        # its numpy views (numpy's argmax also returns the first maximal index), each torch op of
        # the generic path costing ~5-10 µs on a [1, V] row (batch-1 decode, docs/performance.md).
        lp = torch.log_softmax(logits, dim=-1).numpy()
        x = logits.numpy()
        if x.shape[0] == 1:
            tok = int(x[0].argmax())
            lps = [float(lp[0, tok])]
            toks = [tok]
        else:
            idx = x.argmax(axis=1)
            lps = lp[np.arange(x.shape[0]), idx].tolist()
            toks = idx.tolist()
    else:
        tokens = logits.argmax(dim=-1)
        chosen, _, _ = raw_logprobs_of(logits, tokens)
        lps = chosen.tolist()
        toks = tokens.tolist()
    if not math.isfinite(sum(lps)):
        return None
    return SampleResult(toks, lps, None)


def greedy_from_pairs(pairs: list[float]) -> SampleResult | None:
    """:func:`greedy_sample`'s result from the C++ pick's values ``[token 0, logprob 0, token 1, ...]``
    (``greedy_logprobs``, or the same values the fused decode op wrote into its ``greedy_out``: one op
    call less in a greedy decode step, issue 12 wave 10): None when a logprob is not finite (the
    caller then takes the general path, as :func:`greedy_sample`)."""
    lps = pairs[1::2]
    if not math.isfinite(sum(lps)):
        return None
    return SampleResult([int(t) for t in pairs[0::2]], lps, None)


def raw_logprobs_of(logits: torch.Tensor, tokens: torch.Tensor, top_k: int = 0,
                    fused_log_softmax: bool | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The raw logprob of ``tokens`` [B] under ``logits`` [B, V] (float32) → ``(chosen [B],
    top values [B, k] | None, top ids [B, k] | None)``, the top-k only when ``top_k`` > 0.

    ``logprob(t) = logit[t] - logsumexp(logits)`` = ``log_softmax(logits)[t]``. Two ways to the
    same numbers (within float32 rounding, ~1e-6), chosen by device (``fused_log_softmax``
    None) or forced:

    * logsumexp + one gather (CUDA): no [B, V] ``log_softmax`` is materialised; the top-k
      logprobs are the top-k logits minus the row's logsumexp (log_softmax is monotone).
    * torch's fused ``log_softmax`` kernel + gather (CPU). Measured on the project CPU
      (torch 2.13, 1 thread, CPU time, [32, 32000]): ``log_softmax`` + gather 2.1 ms,
      ``torch.logsumexp`` + gather 3.4 ms (it materialises ``x - max`` and its ``exp``), a
      hand-fused amax/sub/exp_/sum into a reused buffer 2.4 ms; [1, 32000]: 0.06 vs 0.11 ms.
      The fused kernel is the cheapest normaliser torch has there: its one extra [B, V]
      write costs less than the other compositions' extra passes.
    """
    if fused_log_softmax is None:
        fused_log_softmax = logits.device.type == "cpu"
    k = min(top_k, logits.shape[1])
    if fused_log_softmax:
        lp = torch.log_softmax(logits, dim=-1)
        chosen = lp.gather(1, tokens.unsqueeze(1)).squeeze(1)
        if k > 0:
            vals, ids = lp.topk(k, dim=-1)
            return chosen, vals, ids
        return chosen, None, None
    lse = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(1, tokens.unsqueeze(1)).squeeze(1) - lse
    if k > 0:
        vals, ids = logits.topk(k, dim=-1)
        return chosen, vals - lse[:, None], ids
    return chosen, None, None
