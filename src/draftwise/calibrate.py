"""Calibration: how long one forward over n = 1..K new tokens takes on a backend.

Each size is timed several times at a realistic context length, the rounds interleaved over the
sizes, and the fastest time kept: a shared host only ever adds time, and interleaving spreads a
burst of load over every size instead of one. Curves are cached on disk per (model identity,
threads, n_ctx) and kept as measured — on llama.cpp 16 tokens can cost less than 12 — and n
between measured points is linearly interpolated. A cached curve whose single-token cost is far
above what the host does now (it was measured while something else ran) is measured again.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from draftwise.backends.base import Backend

QUICK_POINTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
MAX_N = 64  # the largest forward timed by default (the auto policy asks for MAX_K + 1)
# Timings per forward size: a thorough run times every size up to max_n, a quick one QUICK_POINTS.
QUICK_REPEATS, THOROUGH_REPEATS = 3, 5
CACHE_VERSION = 1
# A cached curve is measured again when its n=1 cost exceeds this many times a fresh probe's.
STALE_RATIO = 1.5
PROBE_CONTEXT, PROBE_REPEATS = 32, 3


@dataclass(frozen=True)
class CostCurve:
    """ms for one forward over n new tokens; points are (n, ms) sorted by n."""

    points: tuple[tuple[int, float], ...]
    context_len: int = 0
    source: str = "measured"

    def __post_init__(self) -> None:
        if not self.points or self.points[0][0] != 1:
            raise ValueError("a cost curve needs a point at n=1")

    @property
    def max_n(self) -> int:
        return self.points[-1][0]

    def ms(self, n: int) -> float:
        """Cost of a forward over n tokens. Example: points ((1, 30), (4, 90)) -> ms(2) == 50."""
        if n <= 0:
            return 0.0
        pts = self.points
        for (n0, ms0), (n1, ms1) in zip(pts, pts[1:]):
            if n0 <= n <= n1:
                return ms0 + (ms1 - ms0) * (n - n0) / (n1 - n0)
        if n < pts[0][0]:
            return pts[0][1]
        # Beyond the last point: extrapolate with the last per-token slope (never below it).
        if len(pts) >= 2:
            (n0, ms0), (n1, ms1) = pts[-2], pts[-1]
            slope = max((ms1 - ms0) / (n1 - n0), ms1 / n1)
        else:
            slope = pts[-1][1]
        return pts[-1][1] + slope * (n - pts[-1][0])

    def to_dict(self) -> dict:
        return {"points": [list(p) for p in self.points], "context_len": self.context_len, "source": self.source}

    @classmethod
    def from_dict(cls, data: dict) -> CostCurve:
        return cls(
            tuple((int(n), float(ms)) for n, ms in data["points"]),
            int(data.get("context_len", 0)),
            data.get("source", "measured"),
        )

    @classmethod
    def linear(cls, first_ms: float, per_token_ms: float, max_n: int = 32) -> CostCurve:
        """A synthetic curve: ms(n) = first_ms + per_token_ms * (n - 1)."""
        return cls(tuple((n, first_ms + per_token_ms * (n - 1)) for n in range(1, max_n + 1)), source="synthetic")


def cache_key(backend: Backend) -> str:
    threads = getattr(backend, "n_threads", 0)
    raw = f"v{CACHE_VERSION}|{backend.identity}|threads={threads}|n_ctx={backend.n_ctx}"
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def cache_file(backend: Backend) -> Path:
    from draftwise.models import cache_dir

    return cache_dir() / "calibration" / f"{cache_key(backend)}.json"


def _points(backend: Backend, thorough: bool, max_n: int) -> list[int]:
    """The forward sizes to time: up to max_n, and at most half the context window."""
    top = max(1, min(max_n, backend.n_ctx // 2))
    return [n for n in (range(1, top + 1) if thorough else QUICK_POINTS) if n <= top]


def measure(
    backend: Backend, points=QUICK_POINTS, *, context_len: int = 256, repeats: int = 3, max_n: int = MAX_N
) -> CostCurve:
    """Time extend(n) + truncate at context_len tokens of context; the fastest of `repeats` rounds
    per n, each round timing every n once (a burst of load then slows one round, not one n)."""
    points = sorted({n for n in points if 1 <= n <= max_n} | {1})
    context_len = max(1, min(context_len, backend.n_ctx - max(points) - 1))
    vocab = backend.vocab_size
    # Token ids spread over the vocabulary: content barely matters for cost, length does.
    context = [(7919 * i + 13) % min(vocab, 32000) for i in range(context_len)]
    saved = backend.cached_ids
    backend.reset()
    try:
        backend.prefill(context)
        backend.extend(context[:1])  # warm-up
        backend.truncate(context_len)
        times: dict[int, list[float]] = {n: [] for n in points}
        for _ in range(max(1, repeats)):
            for n in points:
                ids = [(104729 * (j + n) + 17) % min(vocab, 32000) for j in range(n)]
                t0 = time.perf_counter()
                backend.extend(ids)
                times[n].append(1000 * (time.perf_counter() - t0))
                backend.truncate(context_len)
        result = [(n, min(times[n])) for n in points]
    finally:
        backend.reset()
        if saved:
            backend.prefill(saved)
    return CostCurve(tuple(result), context_len=context_len)


def stale(backend: Backend, curve: CostCurve) -> bool:
    """Whether a cached curve's single-token cost is more than STALE_RATIO times what a short probe
    measures now (a curve timed on a loaded host would make every draft look cheap or dear). Only
    that direction: a probe slowed by load now must not throw away a curve measured quietly.
    Probed only on an empty backend (at load time): one holding a request's cache would have to
    read it again after the probe."""
    if backend.num_cached:
        return False
    probe = measure(backend, (1,), context_len=PROBE_CONTEXT, repeats=PROBE_REPEATS, max_n=1).ms(1)
    return curve.ms(1) > STALE_RATIO * probe


def load_or_measure(
    backend: Backend, *, thorough: bool = False, refresh: bool = False, max_n: int = MAX_N
) -> CostCurve:
    """The cached curve for this backend, measuring it (quick or thorough) if absent."""
    path = cache_file(backend)
    if path.is_file() and not refresh:
        data = json.loads(path.read_text())
        curve = CostCurve.from_dict(data)
        # A curve measured for shorter drafts (versions before 2026-12-01 planned at most 32
        # tokens) is measured again.
        wanted = max(_points(backend, thorough, max_n))
        if (not thorough or data.get("thorough")) and curve.max_n >= wanted and not stale(backend, curve):
            return curve
    curve = measure(
        backend, _points(backend, thorough, max_n), repeats=THOROUGH_REPEATS if thorough else QUICK_REPEATS, max_n=max_n
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed: another process reading the cache meanwhile sees the old file or
    # the new one, never half of one.
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(
        json.dumps(
            {
                **curve.to_dict(),
                "thorough": thorough,
                "backend": backend.name,
                "identity": backend.identity,
                "threads": getattr(backend, "n_threads", 0),
            }
        )
    )
    tmp.replace(path)
    return curve
