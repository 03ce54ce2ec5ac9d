"""Ollama's `keep_alive`, read as Ollama reads it: how long a model stays loaded after a request.
A duration ("5m", "1h30m", "300ms"), a number of seconds (300, "300", 1e3), 0 (unload as soon as
idle), or for ever: any negative value, and any value longer than Go's longest duration (2**63 - 1
ns, about 292 years), since Ollama's server stores a `time.Duration`. Anything else is no duration.

Example: keep_alive_seconds("1h30m") -> 5400.0, keep_alive_seconds("-1") -> FOREVER,
keep_alive_seconds("99999999h") -> FOREVER, keep_alive_seconds("banana") -> None.
"""

from __future__ import annotations

import math
import re

FOREVER = -1.0
# Go's time.Duration tops out at 2**63 - 1 ns; a longer keep_alive means for ever.
MAX_DURATION_S = (2**63 - 1) / 1e9
KEEP_ALIVE_RULE = 'give a duration such as "5m", "1h30m", 300 (seconds), 0 (unload now) or -1 (keep)'

_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_MAX_TEXT = 100  # characters: no duration is longer


def keep_alive_seconds(value: object) -> float | None:
    """keep_alive as seconds, FOREVER (-1.0) for a negative or an over-long one; None where it is
    absent or no duration (the caller words that 400, naming keep_alive)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):  # any size: compared as an integer, never made a float first
        return FOREVER if value < 0 or value > MAX_DURATION_S else float(value)
    if isinstance(value, float):
        return _seconds(value)
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        return None
    text = value.strip()
    if _NUMBER.fullmatch(text):
        return _seconds(float(text))  # "1e400" reads as inf: longer than any duration, so for ever
    sign = -1.0 if text.startswith("-") else 1.0
    text = text[1:] if text[:1] in "+-" else text
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return _seconds(sign * sum(float(n) * _UNIT_S[u] for n, u in parts))


def _seconds(value: float) -> float | None:
    if math.isnan(value):
        return None
    return FOREVER if value < 0 or value > MAX_DURATION_S else value
