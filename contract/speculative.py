"""``--speculative-config``: vLLM's JSON speculative-decoding settings, parsed and validated (shared by the
engine, which runs them, and the controller, which checks an engine's ``launch.speculative_config`` at load).

Accepted keys (vLLM's names, https://docs.vllm.ai/en/latest/features/spec_decode.html):

- ``method``: ``"ngram"`` (prompt lookup: the draft is what followed the last occurrence of
  the context's last n tokens; no second model), ``"draft_model"`` (a second checkpoint with
  the same tokenizer, given by ``model``), or ``"int8_self"`` (inferctl's self-draft: the
  target model's own weights quantized to int8 per output channel draft for the target).
- ``num_speculative_tokens``: draft tokens proposed per step, 1..16.
- ``prompt_lookup_max`` / ``prompt_lookup_min`` (ngram only): the longest and shortest suffix
  n-gram looked up, 1..32, min <= max. Defaults: max 4, min 1 (the longest match wins).
- ``model`` (draft_model only, required): the draft checkpoint's path (anything
  ``engine.loader.load_model`` reads).

Anything else is refused: :class:`SpeculativeConfigError` names the key
(``speculative_config.<key>``) and the limit (``EngineConfig`` re-raises it as its
``ConfigError``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass



class SpeculativeConfigError(ValueError):
    """An invalid speculative setting: ``field`` is ``speculative_config[.key]``, the message
    states the limit (the same shape as ``engine.config.ConfigError``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


ConfigError = SpeculativeConfigError
METHOD_NGRAM = "ngram"
METHOD_DRAFT_MODEL = "draft_model"
METHOD_INT8_SELF = "int8_self"
METHODS = (METHOD_NGRAM, METHOD_DRAFT_MODEL, METHOD_INT8_SELF)
MAX_SPECULATIVE_TOKENS = 16
MAX_PROMPT_LOOKUP = 32
DEFAULT_PROMPT_LOOKUP_MAX = 4
DEFAULT_PROMPT_LOOKUP_MIN = 1
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model")
_FIELD = "speculative_config"


@dataclass(frozen=True)
class SpeculativeConfig:
    """Validated speculative-decoding settings (see the module docstring)."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = DEFAULT_PROMPT_LOOKUP_MAX
    prompt_lookup_min: int = DEFAULT_PROMPT_LOOKUP_MIN
    model: str | None = None

    def to_dict(self) -> dict:
        out: dict = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method == METHOD_NGRAM:
            out.update(prompt_lookup_max=self.prompt_lookup_max, prompt_lookup_min=self.prompt_lookup_min)
        if self.model is not None:
            out["model"] = self.model
        return out


def _int(d: dict, key: str, lo: int, hi: int, default: int | None = None) -> int:
    v = d.get(key, default)
    if v is None:
        raise ConfigError(f"{_FIELD}.{key}", f"is required (an integer {lo}..{hi})")
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{_FIELD}.{key}", f"must be an integer {lo}..{hi}, got {v!r}")
    if not lo <= v <= hi:
        raise ConfigError(f"{_FIELD}.{key}", f"must be {lo}..{hi}, got {v}")
    return v


def parse_speculative_config(value: str | dict | SpeculativeConfig | None) -> SpeculativeConfig | None:
    """Parse the flag's JSON text (or an already-decoded dict) into a :class:`SpeculativeConfig`.

    ``None`` or an empty string/dict means speculation off (returns None).

    Raises:
        SpeculativeConfigError: not JSON (or nested too deeply to parse), not an object, an unknown key,
            a method outside :data:`METHODS`,
            ``num_speculative_tokens`` outside 1..16, a prompt-lookup bound outside 1..32 or
            min > max, ngram keys with another method, ``model`` missing for draft_model or
            given for another method. The field is ``speculative_config[.key]``.
    """
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ConfigError(_FIELD, f"must be a JSON object, e.g. "
                              f'{{"method": "ngram", "num_speculative_tokens": 4}}: {err}') from None
        except RecursionError:
            raise ConfigError(_FIELD, "must be a flat JSON object: nested too deeply to parse") from None
    if not isinstance(value, dict):
        raise ConfigError(_FIELD, f"must be a JSON object, got {type(value).__name__}")
    if not value:
        return None
    unknown = sorted(k for k in value if k not in _KEYS)
    if unknown:
        raise ConfigError(f"{_FIELD}.{unknown[0]}", f"unknown key; the keys are {', '.join(_KEYS)}")
    method = value.get("method")
    if method not in METHODS:
        raise ConfigError(f"{_FIELD}.method", f"must be one of {', '.join(METHODS)}, got {method!r}")
    k = _int(value, "num_speculative_tokens", 1, MAX_SPECULATIVE_TOKENS)
    if method != METHOD_NGRAM:
        for key in ("prompt_lookup_max", "prompt_lookup_min"):
            if key in value:
                raise ConfigError(f"{_FIELD}.{key}", f"applies to method ngram only, not {method}")
    hi = _int(value, "prompt_lookup_max", 1, MAX_PROMPT_LOOKUP, DEFAULT_PROMPT_LOOKUP_MAX)
    lo = _int(value, "prompt_lookup_min", 1, MAX_PROMPT_LOOKUP, min(DEFAULT_PROMPT_LOOKUP_MIN, hi))
    if lo > hi:
        raise ConfigError(f"{_FIELD}.prompt_lookup_min", f"must be <= prompt_lookup_max ({hi}), got {lo}")
    model = value.get("model")
    if method == METHOD_DRAFT_MODEL:
        if not isinstance(model, str) or not model:
            raise ConfigError(f"{_FIELD}.model", "is required for method draft_model (the draft checkpoint's path)")
    elif model is not None:
        raise ConfigError(f"{_FIELD}.model", f"applies to method draft_model only, not {method}")
    return SpeculativeConfig(method, k, hi, lo, model)
