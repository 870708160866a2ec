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
5. sampled rows: ``logits / temperature``; top-k then top-p (nucleus: keep the smallest set of
   most likely tokens whose probability sums to >= top_p; Holtzman et al. 2019); softmax;
   one draw with ``torch.multinomial``.

Logprobs are "raw logprobs" (vLLM's default ``logprobs_mode="raw_logprobs"``): the
``log_softmax`` of the model's unprocessed logits, before penalties, temperature and
truncation. So a token's logprob says how likely the *model* found it, the same whatever the
request's sampling settings, which is what perplexity (``engine.quality.perplexity``) needs.

Reproducibility: a row with a ``torch.Generator`` (a seeded request) is drawn alone with its
generator, and whether it goes through the sorted (top-k/top-p) path depends only on its own
parameters, so a seeded request yields the same tokens alone or in any batch. Rows without a
generator share the sampler's own generator (one per device), drawn in one call.

Cost: the all-greedy batch without penalties takes a fast path (argmax + one log_softmax);
penalties cost O(sum of history lengths) per step for the rows that use them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.sampling_params import SamplingParams

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
        """[len(seqs), V] int64 occurrence counts, via one bincount over row-offset ids."""
        flat: list[int] = []
        offsets: list[int] = []
        for r, seq in enumerate(seqs):
            flat.extend(seq)
            offsets.extend([r * vocab] * len(seq))
        if not flat:
            return torch.zeros(len(seqs), vocab, dtype=torch.long, device=device)
        ids = torch.tensor(flat, dtype=torch.long, device=device)
        if bool((ids < 0).any()) or bool((ids >= vocab).any()):
            raise ValueError(f"token_histories holds a token id outside [0, {vocab})")
        ids = ids + torch.tensor(offsets, dtype=torch.long, device=device)
        return torch.bincount(ids, minlength=len(seqs) * vocab).view(len(seqs), vocab)

    rep_rows = [i for i in rows if params[i].repetition_penalty != 1.0]
    if rep_rows:
        ridx = torch.tensor(rep_rows, device=device)
        seen = counts_of([token_histories[i] for i in rep_rows]) > 0
        penalty = torch.tensor([params[i].repetition_penalty for i in rep_rows],
                               dtype=out.dtype, device=device).unsqueeze(1)
        x = out[ridx]
        out[ridx] = torch.where(seen, torch.where(x > 0, x / penalty, x * penalty), x)
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

        logits = logits.float()
        raw_logprobs = torch.log_softmax(logits, dim=-1)
        all_finite = bool(torch.isfinite(logits).all())

        if all_finite and all(p.is_greedy and not p.has_penalties for p in params):
            tokens = logits.argmax(dim=-1)
            return self._result(tokens, raw_logprobs, params, [])

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
        return self._result(tokens, raw_logprobs, params, nonfinite_rows)

    def _sample_rows(self, work: torch.Tensor, tokens: torch.Tensor, rows: list[int],
                     params: list[SamplingParams], generators: list[torch.Generator | None]
                     ) -> None:
        """Temperature, top-k, top-p and one draw for each row in ``rows``; writes ``tokens``."""
        vocab = work.shape[1]
        device = work.device
        # Rows that truncate the distribution go through the sorted path, the others through
        # the plain one; the choice depends on the row's own parameters only (see module doc).
        filtered = [i for i in rows if params[i].top_k > 0 or params[i].top_p < 1.0]
        filtered_set = set(filtered)
        plain = [i for i in rows if i not in filtered_set]
        for group, truncate in ((plain, False), (filtered, True)):
            if not group:
                continue
            idx = torch.tensor(group, device=device)
            temps = torch.tensor([params[i].temperature for i in group],
                                 dtype=work.dtype, device=device).unsqueeze(1)
            # clamp: +inf (or a huge logit / small temperature) would make softmax NaN
            x = (work[idx] / temps).clamp(max=_FLOAT32_MAX)
            order = None
            if truncate:
                x, order = x.sort(dim=-1, descending=True, stable=True)
                ks = torch.tensor([min(params[i].top_k, vocab) if params[i].top_k > 0 else vocab
                                   for i in group], device=device).unsqueeze(1)
                drop = torch.arange(vocab, device=device).unsqueeze(0) >= ks
                x = x.masked_fill(drop, float("-inf"))
                probs = torch.softmax(x, dim=-1)
                ps = torch.tensor([params[i].top_p for i in group],
                                  dtype=probs.dtype, device=device).unsqueeze(1)
                # Drop a token when the mass before it already reaches top_p; the most likely
                # token (mass before it = 0 < top_p) is always kept.
                drop = (probs.cumsum(dim=-1) - probs) >= ps
                x = x.masked_fill(drop, float("-inf"))
            probs = torch.softmax(x, dim=-1)
            chosen = self._draw(probs, [generators[i] for i in group])
            if order is not None:
                chosen = order.gather(1, chosen.unsqueeze(1)).squeeze(1)
            tokens[idx] = chosen

    def _draw(self, probs: torch.Tensor, gens: list[torch.Generator | None]) -> torch.Tensor:
        """One multinomial draw per row; seeded rows alone with their generator."""
        out = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
        shared_rows = [r for r, g in enumerate(gens) if g is None]
        if shared_rows:
            sidx = torch.tensor(shared_rows, device=probs.device)
            out[sidx] = torch.multinomial(probs[sidx], 1,
                                          generator=self._shared_generator(probs.device)
                                          ).squeeze(1)
        for r, gen in enumerate(gens):
            if gen is not None:
                out[r] = torch.multinomial(probs[r:r + 1], 1, generator=gen)[0, 0]
        return out

    @staticmethod
    def _result(tokens: torch.Tensor, raw_logprobs: torch.Tensor, params: list[SamplingParams],
                nonfinite_rows: list[int]) -> SampleResult:
        chosen_lp = raw_logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
        token_list = tokens.tolist()
        lp_list = chosen_lp.tolist()
        top: list[dict[int, float]] | None = None
        kmax = max((p.logprobs or 0) for p in params)
        if kmax > 0:
            vals, ids = raw_logprobs.topk(min(kmax, raw_logprobs.shape[1]), dim=-1)
            vals_l, ids_l = vals.tolist(), ids.tolist()
            top = []
            for r, p in enumerate(params):
                k = p.logprobs or 0
                top.append({int(t): float(v) for t, v in zip(ids_l[r][:k], vals_l[r][:k])})
        elif any(p.logprobs is not None for p in params):
            top = [{} for _ in params]
        return SampleResult(token_list, [float(v) for v in lp_list], top, nonfinite_rows)
