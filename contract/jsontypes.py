"""Strict JSON field types and model bases for the engine's request shapes (pydantic v2).

JSON does not tell integers from integral floats, and the OpenAI clients send both, so an
integer field takes ``20`` and ``20.0`` (and ``1e12``) but never ``"20"``, ``true`` or
``20.5``; a number field takes any finite JSON number, never a string or a boolean. Strings
are never coerced (docs/field-cases.md, "OpenAI-compatible API").
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict
from pydantic_core import PydanticCustomError

from inferctl.contract.jsonvalues import json_integer


def _strict_int(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("int_type", "must be an integer, not a boolean")
    number = json_integer(value)
    if number is not None:
        return number
    if isinstance(value, str):
        raise PydanticCustomError("int_type", "must be an integer, not a string (strings are not coerced)")
    raise PydanticCustomError("int_type", "must be an integer")


#: An integer: JSON integers, or JSON numbers with an integral value (1e12); never strings or booleans.
JsonInt = Annotated[int, BeforeValidator(_strict_int)]


def _strict_number(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("float_type", "must be a number, not a boolean")
    if isinstance(value, str):
        raise PydanticCustomError("float_type", "must be a number, not a string (strings are not coerced)")
    return value


#: A finite number (int or float); never strings or booleans.
JsonFloat = Annotated[float, BeforeValidator(_strict_number)]


class StrictModel(BaseModel):
    """Strict types, no NaN/infinity; unknown fields are ignored (the OpenAI routes)."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class ClosedModel(BaseModel):
    """Strict types, no NaN/infinity, and unknown fields refused (the admin routes)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
