"""Plain checks of decoded JSON values, without pydantic (the CLI and the model loaders use them:
``inferctl plan`` reading a ``config.json``, the engine's Hugging Face loader;
:mod:`inferctl.contract.jsontypes` builds the request models' strict integer on it).
"""

from __future__ import annotations

import math
from typing import Any

#: The largest count (layers, heads, hidden size, vocabulary, context) a model's config may give: a
#: signed 32-bit int, what every kernel indexes with, far above any real model (vocabularies ~256k,
#: hidden sizes ~32k), so no product of them overflows a float (``inferctl plan`` and the HF loader
#: both refuse more).
MAX_DIMENSION = (1 << 31) - 1


def json_integer(value: Any) -> int | None:
    """The integer a decoded JSON value stands for: an ``int``, or a finite ``float`` with an
    integral value (``20.0``, ``1e12``); None for anything else — a boolean, a string, a
    fraction, NaN or infinity, null, a list or an object. (JSON has one number type, and
    writers such as transformers' ``config.json`` or the OpenAI clients send ``20.0`` for 20.)"""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def json_number(value: Any) -> float | None:
    """The finite float a decoded JSON number stands for (an int too, if it fits a float); None for
    anything else — a boolean, a string, null, NaN, an infinity or an int beyond float's range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
