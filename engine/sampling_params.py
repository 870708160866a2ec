"""Per-request sampling parameters, validated on construction.

Names and meanings follow vLLM's ``SamplingParams`` and the OpenAI completions API
(https://platform.openai.com/docs/api-reference/completions/create). Every bound is checked in
``__post_init__``; a bad value raises :class:`SamplingParamsError`, whose ``field`` names the
offending field and whose message states the bound, so the server can answer 400 with it.

Limits that an operator may want to change (number of stop strings, their length, the number
of top logprobs) live in :class:`SamplingLimits`, passed as the ``limits`` field (the engine
builds it from ``EngineConfig``). ``max_tokens`` is checked here only against 1; its upper
bound (prompt + max_tokens <= max_model_len) depends on the prompt and is the engine's
admission check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real

#: Temperatures below this are treated as greedy (argmax), like vLLM's ``_SAMPLING_EPS``:
#: dividing logits by ~0 overflows and the distribution is a point mass anyway.
GREEDY_TEMPERATURE_EPS = 1e-5

#: ``torch.Generator.manual_seed`` accepts seeds in [-2**63, 2**64 - 1].
SEED_MIN = -(2**63)
SEED_MAX = 2**64 - 1


class SamplingParamsError(ValueError):
    """A sampling parameter is out of bounds.

    Attributes:
        field: the parameter's name, e.g. ``"top_p"``.
        message: what is wrong, with the bound, e.g. ``"must be > 0 and <= 1, got 0.0"``.

    ``str(err)`` is ``"<field>: <message>"``.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class SamplingLimits:
    """Configurable upper bounds for list-valued and logprob parameters.

    Attributes:
        max_stop_strings: most stop strings per request (default 16).
        max_stop_string_chars: longest stop string, in characters (default 256). The
            detokenizer holds back at most this many - 1 characters, so it bounds latency too.
        max_stop_token_ids: most stop token ids per request (default 256).
        max_logprobs: most top logprobs per token (default 20, the OpenAI maximum).
    """

    max_stop_strings: int = 16
    max_stop_string_chars: int = 256
    max_stop_token_ids: int = 256
    max_logprobs: int = 20

    def __post_init__(self) -> None:
        for name in ("max_stop_strings", "max_stop_string_chars", "max_stop_token_ids",
                     "max_logprobs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
                raise SamplingParamsError(name, f"must be an integer >= 0, got {value!r}")


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise SamplingParamsError(name, f"must be an integer, got {value!r}")
    return int(value)


def _check_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise SamplingParamsError(name, f"must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise SamplingParamsError(name, f"must be finite, got {value!r}")
    return out


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise SamplingParamsError(name, f"must be true or false, got {value!r}")
    return value


@dataclass
class SamplingParams:
    """How to pick the next tokens of one request.

    Attributes:
        max_tokens: most tokens to generate; integer >= 1 (default 16, as vLLM and OpenAI).
            The upper bound (prompt + max_tokens <= max_model_len) is the engine's check.
        temperature: 0 = greedy (argmax); otherwise logits are divided by it. 0 <= t <= 2
            (the OpenAI range). Values below ``GREEDY_TEMPERATURE_EPS`` are greedy.
        top_k: keep the k most likely tokens; -1 or 0 = off, else >= 1 (vLLM: -1 = off).
        top_p: nucleus sampling (Holtzman et al. 2019, "The Curious Case of Neural Text
            Degeneration"): keep the smallest set of most likely tokens whose probability
            sums to >= top_p; 0 < top_p <= 1 (1 = off).
        seed: makes sampling reproducible per request (its own ``torch.Generator``), alone or
            in any batch; None = the sampler's shared generator. Integer in [-2**63, 2**64-1].
        repetition_penalty: CTRL penalty (Keskar et al. 2019, "CTRL: A Conditional
            Transformer Language Model for Controllable Generation", eq. in section 4.1), as
            Hugging Face ``RepetitionPenaltyLogitsProcessor``: for every token id present in
            prompt + output, logit / penalty if logit > 0 else logit * penalty. Finite, > 0
            (as vLLM); 1 = off; > 1 discourages repeats, < 1 encourages them.
        presence_penalty: OpenAI presence penalty, -2..2: subtract it once from the logit of
            every token that occurs in the output so far (vLLM: output tokens only).
        frequency_penalty: OpenAI frequency penalty, -2..2: subtract it times the token's
            count in the output so far.
        stop: stop strings; generation ends when the output text contains one, and neither
            it nor anything after it is returned. A single ``str`` is accepted and becomes a
            one-element list. Each non-empty, at most ``limits.max_stop_string_chars``
            characters; at most ``limits.max_stop_strings`` of them.
        stop_token_ids: token ids that end generation (in addition to EOS); each >= 0 (the
            upper bound, vocab_size, is the engine's check); at most
            ``limits.max_stop_token_ids``.
        logprobs: None = no top logprobs; 0..``limits.max_logprobs`` = that many top
            logprobs per generated token (the chosen token's logprob is always computed).
        prompt_logprobs: None = no prompt logprobs; 0..``limits.max_logprobs`` = the logprob
            of every prompt token given the tokens before it, plus that many top alternatives
            per position (vLLM's ``prompt_logprobs``).
        ignore_eos: keep generating after EOS (benchmarks).
        repetition_stop: end with finish_reason "repetition" when
            ``engine.quality.detect_repetition_loop`` fires on the output tokens; None = the
            server's default (``EngineConfig.repetition_stop_default``, ``--repetition-stop``).
        limits: the configurable bounds above (not a request field; the engine passes
            ``SamplingLimits`` from its configuration).

    Raises:
        SamplingParamsError: on the first field out of bounds (``err.field`` names it).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    ignore_eos: bool = False
    repetition_stop: bool | None = None
    limits: SamplingLimits = field(default_factory=SamplingLimits, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.limits, SamplingLimits):
            raise SamplingParamsError("limits", f"must be SamplingLimits, got {self.limits!r}")
        lim = self.limits

        self.max_tokens = _check_int("max_tokens", self.max_tokens)
        if self.max_tokens < 1:
            raise SamplingParamsError("max_tokens", f"must be >= 1, got {self.max_tokens}")

        self.temperature = _check_float("temperature", self.temperature)
        if not 0.0 <= self.temperature <= 2.0:
            raise SamplingParamsError(
                "temperature", f"must be >= 0 and <= 2, got {self.temperature}")

        self.top_k = _check_int("top_k", self.top_k)
        if self.top_k < -1:
            raise SamplingParamsError(
                "top_k", f"must be -1 or 0 (off) or >= 1, got {self.top_k}")

        self.top_p = _check_float("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingParamsError("top_p", f"must be > 0 and <= 1, got {self.top_p}")

        if self.seed is not None:
            self.seed = _check_int("seed", self.seed)
            if not SEED_MIN <= self.seed <= SEED_MAX:
                raise SamplingParamsError(
                    "seed", f"must be >= {SEED_MIN} and <= {SEED_MAX}, got {self.seed}")

        self.repetition_penalty = _check_float("repetition_penalty", self.repetition_penalty)
        if not self.repetition_penalty > 0.0:
            raise SamplingParamsError(
                "repetition_penalty", f"must be > 0 (1 = off), got {self.repetition_penalty}")

        for name in ("presence_penalty", "frequency_penalty"):
            value = _check_float(name, getattr(self, name))
            if not -2.0 <= value <= 2.0:
                raise SamplingParamsError(name, f"must be >= -2 and <= 2, got {value}")
            setattr(self, name, value)

        self.stop = self._check_stop(self.stop, lim)
        self.stop_token_ids = self._check_stop_token_ids(self.stop_token_ids, lim)

        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                value = _check_int(name, value)
                if not 0 <= value <= lim.max_logprobs:
                    raise SamplingParamsError(name, f"must be >= 0 and <= {lim.max_logprobs}, got {value}")
                setattr(self, name, value)

        self.ignore_eos = _check_bool("ignore_eos", self.ignore_eos)
        if self.repetition_stop is not None:
            self.repetition_stop = _check_bool("repetition_stop", self.repetition_stop)

    @staticmethod
    def _check_stop(stop: object, lim: SamplingLimits) -> list[str]:
        if stop is None:
            return []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, (list, tuple)):
            raise SamplingParamsError(
                "stop", f"must be a string or a list of strings, got {stop!r}")
        if len(stop) > lim.max_stop_strings:
            raise SamplingParamsError(
                "stop", f"at most {lim.max_stop_strings} stop strings, got {len(stop)}")
        out: list[str] = []
        for i, s in enumerate(stop):
            if not isinstance(s, str):
                raise SamplingParamsError("stop", f"stop[{i}] must be a string, got {s!r}")
            if not s:
                raise SamplingParamsError("stop", f"stop[{i}] must not be empty")
            if len(s) > lim.max_stop_string_chars:
                raise SamplingParamsError(
                    "stop", f"stop[{i}] must be at most {lim.max_stop_string_chars} "
                            f"characters, got {len(s)}")
            out.append(s)
        return out

    @staticmethod
    def _check_stop_token_ids(ids: object, lim: SamplingLimits) -> list[int]:
        if ids is None:
            return []
        if not isinstance(ids, (list, tuple)):
            raise SamplingParamsError("stop_token_ids", f"must be a list of integers, got {ids!r}")
        if len(ids) > lim.max_stop_token_ids:
            raise SamplingParamsError(
                "stop_token_ids", f"at most {lim.max_stop_token_ids} ids, got {len(ids)}")
        out: list[int] = []
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, Integral) or t < 0:
                raise SamplingParamsError(
                    "stop_token_ids", f"stop_token_ids[{i}] must be an integer >= 0, got {t!r}")
            out.append(int(t))
        return out

    @property
    def is_greedy(self) -> bool:
        """True when the next token is the argmax (temperature below the greedy epsilon)."""
        return self.temperature < GREEDY_TEMPERATURE_EPS

    @property
    def has_penalties(self) -> bool:
        """True when repetition, presence or frequency penalties change the logits."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)
