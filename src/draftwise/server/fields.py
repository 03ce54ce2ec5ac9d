"""The wire values every protocol refuses at its edge: numbers JSON cannot carry exactly (not
finite: `1e400`, `NaN`, `Infinity`, which Python's json module reads as floats; integers beyond
64 bits where a field is one) and text that is not Unicode (a lone surrogate, which json reads
from an escaped "\\ud800"). `WireModel` is the base of every protocol's request schema.

A refusal is a pydantic error whose ctx `within` carries the path inside a free-form field
(`options.num_predict`, `metadata.<key>`), which errors.install adds to the field it names.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator
from pydantic_core import PydanticCustomError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT64_RULE = "must be an integer that fits in 64 bits (-2**63 to 2**63 - 1)"
FINITE_RULE = "must be a finite number (JSON has no infinities or NaN)"


def int64(value: int) -> bool:
    """Whether an integer fits in 64 bits (the engine's and the backends' integers)."""
    return INT64_MIN <= value <= INT64_MAX


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in text, else None. Example: "a\\ud800" -> 1."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def fault(value: Any) -> tuple[tuple[str | int, ...], str] | None:
    """The first part of a JSON value (as json.loads gives it) that no protocol takes, as (its
    path inside value, why), else None: a string or key holding a lone surrogate, a number that
    is not finite. Walked without recursion (a body may nest deeply); models are skipped, as
    their own fields were checked.
    Example: {"a": [1, float("inf")]} -> (("a", 1), "must be a finite number ...")."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            at = lone_surrogate(item)
            if at is not None:
                return path, _surrogate(item[at])
        elif isinstance(item, float):
            if not math.isfinite(item):
                return path, FINITE_RULE
        elif isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                at = lone_surrogate(key) if isinstance(key, str) else None
                if at is not None:  # named by where it stands: the key itself cannot be quoted
                    return path, f"a key {_surrogate(key[at])}"
                stack.append(((*path, key), inner))
        elif isinstance(item, (list, tuple)):
            stack.extend(((*path, i), inner) for i, inner in reversed(list(enumerate(item))))
    return None


def _surrogate(char: str) -> str:
    return f"holds U+{ord(char):04X}, a lone surrogate, which is not valid Unicode text"


class WireModel(BaseModel):
    """Base of the request schemas: a float field refuses what is not finite, an integer field
    what does not fit in 64 bits, and every field's value (free-form objects included) is walked
    for non-finite numbers and lone surrogates. An integer inside a free-form object (a tool
    call's arguments, a JSON schema's const) is the client's data and stays as sent."""

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _wire_value(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and not int64(value):
            raise PydanticCustomError("int64", INT64_RULE)
        found = fault(value)
        if found is not None:
            within, why = found
            raise PydanticCustomError("wire_value", "{why}", {"why": why, "within": within})
        return value
