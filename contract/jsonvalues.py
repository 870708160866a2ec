"""Plain checks of decoded JSON values, without pydantic (the CLI and the model loaders use them:
``inferctl plan`` reading a ``config.json``, the engine's Hugging Face loader;
:mod:`inferctl.contract.jsontypes` builds the request models' strict integer on it).
"""

from __future__ import annotations

import math
from typing import Any


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
