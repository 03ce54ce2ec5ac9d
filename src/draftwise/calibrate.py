"""Calibration: how long one forward over n = 1..K new tokens takes on a backend, and how that
grows with the context the forward attends to.

Each size is timed several times at each of a few context lengths (CONTEXTS, those that fit the
window), the rounds interleaved over the sizes, and the fastest time kept: a shared host only
ever adds time, and interleaving spreads a burst of load over every size instead of one. The
timings are then fitted to

    ms(n, c) = W(n) + (c - c0) / 1000 * g(n),   g(1) = g1,  g(n > 1) = a + b * n

(c0 the shortest context timed): W(n), the forward over n rows at c0, is kept per size as
measured — on llama.cpp 16 tokens can cost less than 12 — but estimated from every context's
timing at once, so each point averages several rounds' noise instead of carrying one; g(n) is
what each 1,000 tokens of context add (reading the cache: a; attending from each row: b). A
single row's growth g1 is fitted on its own: llama.cpp attends from one row with other kernels
than from many, and one line through both priced one row 10-14% high and 2-65 rows 1-5% low at
8k-28k tokens of context, so drafts there looked cheaper than they were (docs/long-context.md).
Two rounds of the same grid differ by up to a quarter per point on a shared host, the reason for
the pooled fit (docs/bench/code-edit-long-4-ctx).

Curves are cached on disk per (model identity, threads, n_ctx, one sequence or several: slots
and trees run other kernels); n between measured points is linearly interpolated. A cached
curve whose single-token cost is far above what the host does now (it was measured while
something else ran) is measured again. Measuring takes minutes on a
real model: callers do it before anything is timed (loading.calibrate_engine), and a `progress`
callback hears of every round.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from draftwise.backends.base import Backend

QUICK_POINTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
MAX_N = 64  # the largest forward timed by default (the auto policy asks for MAX_K + 1)
# Timings per forward size: a thorough run times every size up to max_n, a quick one QUICK_POINTS.
QUICK_REPEATS, THOROUGH_REPEATS = 3, 5
# 2: timed at several contexts (growth); 3: one row's growth fitted apart, the timings kept;
# 4: contexts timed up and down again (a host's drift was fitted as growth). Curves of an
# older version are measured again.
CACHE_VERSION = 4
# The context lengths timed (those with room for the largest forward in the window). 8,192 is
# timed only in windows that hold it: a growth fitted over 256-2,048 alone is extrapolated ten
# times its range at 16k-32k (docs/long-context.md compares both with measured forwards). It
# costs one 8k prefill per model, once per cache entry, in windows larger than 8k only.
CONTEXTS = (256, 1024, 2048, 8192)
# Cached curves without a record of their contexts were timed up to this one.
LEGACY_LONGEST = 2048
# A cached curve is measured again when its n=1 cost exceeds this many times a fresh probe's.
STALE_RATIO = 1.5
PROBE_CONTEXT, PROBE_REPEATS = 32, 3

# Told (rounds done, rounds in all) as a measurement goes: (0, total) before the first round.
Progress = Callable[[int, int], None]


# CostCurve.ms reads sizes up to this from a table made once (a batch's rows may go past it).
TABLE_ROWS = 160


@dataclass(frozen=True)
class CostCurve:
    """ms for one forward over n new tokens; points are (n, ms) sorted by n."""

    points: tuple[tuple[int, float], ...]
    context_len: int = 0
    source: str = "measured"
    # ms that each 1,000 tokens of context beyond context_len add to a forward over n rows:
    # growth[0] + growth[1] * n (fitted by fit_grid; (0, 0): not measured, cost read at any context)
    growth: tuple[float, float] = (0.0, 0.0)
    # ms that 1,000 tokens more add to a one-row forward (None: growth[0] + growth[1], as curves
    # fitted with one line for every size, before cache version 3, priced it)
    growth_one: float | None = None
    # the fastest timing per (context, rows) that the curve was fitted to (a measured curve only)
    timings: Mapping[int, Mapping[int, float]] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.points or self.points[0][0] != 1:
            raise ValueError("a cost curve needs a point at n=1")
        # (base ms, growth per 1,000 tokens) for n = 0..TABLE_ROWS: the policy prices every k of
        # every proposal at every step, so ms() reads them instead of searching the points.
        table = [(self._base(n), self.growth_at(n)) for n in range(TABLE_ROWS + 1)]
        object.__setattr__(self, "_table", table)

    @property
    def max_n(self) -> int:
        return self.points[-1][0]

    def ms(self, n: int, context: int | None = None) -> float:
        """Cost of a forward over n tokens attending to `context` tokens (None: at the context the
        curve was timed at). Example: points ((1, 30), (4, 90)) -> ms(2) == 50; with context_len
        256 and growth (8, 2), ms(1, 1256) == 30 + 10 (and 30 + 6 with growth_one 6)."""
        if n <= 0:
            return 0.0
        base, growth = self._table[n] if n <= TABLE_ROWS else (self._base(n), self.growth_at(n))
        if context is None or not self.grows:
            return base
        extra = (context - self.context_len) / 1000 * growth
        # Below the timed context the fit is extrapolated down, never below half the timed cost.
        return max(base + extra, 0.5 * base)

    @property
    def grows(self) -> bool:
        """Whether the curve knows how its cost grows with context (timed at several)."""
        return self.growth != (0.0, 0.0) or bool(self.growth_one)

    def growth_at(self, n: int) -> float:
        """ms that 1,000 tokens more context add to a forward over n rows."""
        return _growth_at(self.growth, self.growth_one, n)

    def growth_text(self) -> str:
        """The growth as the CLI tables caption it. Example: '5.4 ms for one row, 4.1 + 1.90 n ms'."""
        one = f"{self.growth_at(1):.1f} ms for one row, " if self.growth_one is not None else ""
        return f"{one}{self.growth[0]:.1f} + {self.growth[1]:.2f} n ms"

    def _base(self, n: int) -> float:
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
        return {
            "points": [list(p) for p in self.points],
            "context_len": self.context_len,
            "source": self.source,
            "growth": list(self.growth),
            "growth_one": self.growth_one,
            **(
                {"timings": {str(c): {str(n): ms for n, ms in by_n.items()} for c, by_n in self.timings.items()}}
                if self.timings
                else {}
            ),
        }

    @classmethod
    def from_points(
        cls,
        points: Mapping,
        context_len: int = 0,
        growth: Sequence[float] = (0.0, 0.0),
        growth_one: float | None = None,
    ) -> CostCurve:
        """From {n: ms} as bench results keep it (keys may be strings). Example: {"1": 30, "4": 90}."""
        pairs = tuple(sorted((int(n), float(ms)) for n, ms in points.items()))
        one = None if growth_one is None else float(growth_one)
        return cls(pairs, int(context_len), growth=(float(growth[0]), float(growth[1])), growth_one=one)

    @classmethod
    def from_meta(cls, meta: dict, name: str = "target") -> CostCurve | None:
        """Model `name`'s curve from a bench run's meta (calibration, calibration_context), with
        its growth over context where the run recorded it; None when the run calibrated none."""
        points = (meta.get("calibration") or {}).get(name)
        if not points:
            return None
        where = (meta.get("calibration_context") or {}).get(name) or {}
        return cls.from_points(
            points, where.get("context_len", 0), where.get("growth", (0.0, 0.0)), where.get("growth_one")
        )

    @classmethod
    def from_dict(cls, data: dict) -> CostCurve:
        growth = data.get("growth") or (0.0, 0.0)
        one = data.get("growth_one")
        timings = data.get("timings")
        return cls(
            tuple((int(n), float(ms)) for n, ms in data["points"]),
            int(data.get("context_len", 0)),
            data.get("source", "measured"),
            (float(growth[0]), float(growth[1])),
            None if one is None else float(one),
            {int(c): {int(n): float(ms) for n, ms in by_n.items()} for c, by_n in timings.items()} if timings else None,
        )

    @classmethod
    def linear(cls, first_ms: float, per_token_ms: float, max_n: int = 32) -> CostCurve:
        """A synthetic curve: ms(n) = first_ms + per_token_ms * (n - 1)."""
        return cls(tuple((n, first_ms + per_token_ms * (n - 1)) for n in range(1, max_n + 1)), source="synthetic")


@dataclass(frozen=True)
class ScaledCurve(CostCurve):
    """A curve whose forwards cost `factors` times the base curve's: (rows, factor) pairs sorted by
    rows, the factor interpolated linearly between them and held beyond (bench.offline.account.run_prices
    fits them to what a run's forwards took). Example: factors ((1, 0.8), (5, 1.0)) -> ms(3) is
    0.9 x the base curve's."""

    factors: tuple[tuple[float, float], ...] = ()

    def factor(self, n: int) -> float:
        pts = self.factors
        if not pts:
            return 1.0
        if n <= pts[0][0]:
            return pts[0][1]
        for (n0, f0), (n1, f1) in zip(pts, pts[1:]):
            if n <= n1:
                return f0 + (f1 - f0) * (n - n0) / (n1 - n0)
        return pts[-1][1]

    def ms(self, n: int, context: int | None = None) -> float:
        return super().ms(n, context) * self.factor(n)


def cache_key(backend: Backend) -> str:
    return _key(backend.identity, backend.n_threads, backend.n_ctx, _layout(backend))


def _layout(backend: Backend) -> str:
    """'sequences' for a backend whose cache holds several sequences (slots, token trees), else ''.
    Its forwards are timed apart: on llama.cpp such a context runs flash attention (llama.cpp's
    default) where one sequence's does not, and 33 rows cost 1.09-1.11x as much there, one row
    the same; other slots' cells widen the attention too (docs/bench/live-prices)."""
    caps = backend.capabilities
    return "sequences" if caps.num_slots > 1 or caps.max_branches > 1 else ""


def _key(identity: str, threads: int, n_ctx: int, layout: str = "") -> str:
    raw = f"v{CACHE_VERSION}|{identity}|threads={threads}|n_ctx={n_ctx}" + (f"|{layout}" if layout else "")
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def cached_curve(identity: str, threads: int, n_ctx: int) -> CostCurve | None:
    """The cached curve of a model not loaded (its backend's identity, threads and n_ctx), or
    None where it was never measured so (draftwise.pairing prices drafts before loading one)."""
    from draftwise.models import cache_dir

    path = cache_dir() / "calibration" / f"{_key(identity, threads, n_ctx)}.json"
    try:
        return CostCurve.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cache_file(backend: Backend) -> Path:
    from draftwise.models import cache_dir

    return cache_dir() / "calibration" / f"{cache_key(backend)}.json"


def _points(backend: Backend, thorough: bool, max_n: int) -> list[int]:
    """The forward sizes to time: up to max_n, and at most half the context window."""
    top = max(1, min(max_n, backend.n_ctx // 2))
    return [n for n in (range(1, top + 1) if thorough else QUICK_POINTS) if n <= top]


def _context_ids(n: int, vocab: int) -> list[int]:
    # Token ids spread over the vocabulary: content barely matters for cost, length does.
    return [(7919 * i + 13) % min(vocab, 32000) for i in range(n)]


def _time_sizes(backend: Backend, points: Sequence[int], context_len: int, times: dict[int, list[float]]) -> None:
    """One round: extend(n) + truncate back to context_len for each n, appending ms to times[n]."""
    vocab = backend.vocab_size
    for n in points:
        ids = [(104729 * (j + n) + 17) % min(vocab, 32000) for j in range(n)]
        t0 = time.perf_counter()
        backend.extend(ids)
        times[n].append(1000 * (time.perf_counter() - t0))
        backend.truncate(context_len)


def measure(
    backend: Backend, points=QUICK_POINTS, *, context_len: int = 256, repeats: int = 3, max_n: int = MAX_N
) -> CostCurve:
    """Time extend(n) + truncate at context_len tokens of context; the fastest of `repeats` rounds
    per n, each round timing every n once (a burst of load then slows one round, not one n)."""
    points = sorted({n for n in points if 1 <= n <= max_n} | {1})
    context_len = max(1, min(context_len, backend.n_ctx - max(points) - 1))
    return measure_grid(backend, points, contexts=(context_len,), repeats=repeats, max_n=max_n)


def contexts_for(backend: Backend, largest: int) -> list[int]:
    """The CONTEXTS with room for a forward of `largest` rows in the window (at least one)."""
    fit = [c for c in CONTEXTS if c + largest < backend.n_ctx]
    return fit or [max(1, min(CONTEXTS[0], backend.n_ctx - largest - 1))]


def measure_grid(
    backend: Backend,
    points=QUICK_POINTS,
    *,
    contexts: Sequence[int] | None = None,
    repeats: int = 3,
    max_n: int = MAX_N,
    progress: Progress | None = None,
) -> CostCurve:
    """Time every size at every context, keep the fastest of `repeats` rounds per (context, size),
    and fit them (fit_grid). Contexts up in ascending order, then down again: half the rounds at
    each as the cache grows to the next, the other half as it is cut back (a truncation). The
    context is read once, not once per round (which multiplies the time a long context costs);
    a burst of load that slows one round is dropped by the minimum; and a host that slows down
    or speeds up while it is measured shifts the shortest and the longest context alike, where
    timing each context's rounds in turn fitted that change as growth with context, which
    counts n times for n rows (docs/bench/live-prices)."""
    points = sorted({n for n in points if 1 <= n <= max_n} | {1})
    contexts = sorted(set(contexts or contexts_for(backend, max(points))))
    ids = _context_ids(contexts[-1], backend.vocab_size)
    saved = backend.cached_ids
    backend.reset()
    times: dict[int, dict[int, list[float]]] = {c: {n: [] for n in points} for c in contexts}
    num_rounds, done = len(contexts) * max(1, repeats), 0
    try:
        if progress is not None:
            progress(0, num_rounds)
        backend.prefill(ids[: contexts[0]])
        backend.extend(ids[:1])  # warm-up
        backend.truncate(contexts[0])
        up = (max(1, repeats) + 1) // 2
        for c, num in [(c, up) for c in contexts] + [(c, max(1, repeats) - up) for c in reversed(contexts)]:
            if backend.num_cached < c:
                backend.prefill(ids[backend.num_cached : c])
            backend.truncate(c)
            for _ in range(num):
                _time_sizes(backend, points, c, times[c])
                done += 1
                if progress is not None:
                    progress(done, num_rounds)
    finally:
        backend.reset()
        if saved:
            backend.prefill(saved)
    return fit_grid({c: {n: min(ms) for n, ms in by_n.items()} for c, by_n in times.items()})


def fit_grid(times: Mapping[int, Mapping[int, float]]) -> CostCurve:
    """The curve at the shortest context c0 and its growth from timings times[context][n] (ms):
    ms(n, c) = W(n) + (c - c0) / 1000 * g(n), with g(1) = g1 and g(n > 1) = a + b n, each >= 0,
    fitted by least squares on the departures of each size from its mean over contexts, weighted
    by that mean (every size counts by its relative error); W(n) is the mean over contexts of each
    timing less its growth. One row's g1 is fitted on its own timings, a and b on the others' (on
    every size's when one row alone was timed).
    Example: {256: {1: 30, 4: 60, 8: 100}, 1256: {1: 36, 4: 76, 8: 124}} -> points ((1, 30),
    (4, 60), (8, 100)) at 256, growth_one 6 and growth (8, 2): 1,000 more tokens of context add
    6 ms to one row and 8 + 2 n ms to n > 1.
    """
    contexts = sorted(times)
    c0 = contexts[0]
    sizes = sorted(times[c0])
    kept = {c: {n: float(times[c][n]) for n in sizes} for c in contexts}
    if len(contexts) == 1:
        return CostCurve(tuple((n, kept[c0][n]) for n in sizes), context_len=c0, timings=kept)
    x = {c: (c - c0) / 1000 for c in contexts}
    x_mean = sum(x.values()) / len(x)
    mean = {n: sum(times[c][n] for c in contexts) / len(contexts) for n in sizes}

    def fit(group: Sequence[int]) -> tuple[float, float]:
        design = np.array([[(x[c] - x_mean) / mean[n], (x[c] - x_mean) * n / mean[n]] for c in contexts for n in group])
        target = np.array([(times[c][n] - mean[n]) / mean[n] for c in contexts for n in group])
        return _nonnegative_least_squares(design, target)

    many = [n for n in sizes if n > 1]
    a, b = fit(many or sizes)
    growth_one = None
    if many and 1 in sizes:
        one = np.array([(x[c] - x_mean) / mean[1] for c in contexts])
        rise = np.array([(times[c][1] - mean[1]) / mean[1] for c in contexts])
        growth_one = round(max(0.0, float(one @ rise) / float(one @ one)), 4)
    growth = (round(a, 4), round(b, 4))
    points = tuple((n, max(1e-3, mean[n] - x_mean * _growth_at(growth, growth_one, n))) for n in sizes)
    return CostCurve(points, context_len=c0, growth=growth, growth_one=growth_one, timings=kept)


def _growth_at(growth: Sequence[float], growth_one: float | None, n: int) -> float:
    """ms that 1,000 tokens more context add to n rows: growth_one for one row when fitted apart,
    else growth[0] + growth[1] * n."""
    return growth_one if n == 1 and growth_one is not None else growth[0] + growth[1] * n


def _nonnegative_least_squares(design: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    """min |design @ (a, b) - target| with a, b >= 0 (two unknowns: the best of the unconstrained
    solution, if feasible, and each one alone)."""
    candidates = []
    full = np.linalg.lstsq(design, target, rcond=None)[0]
    if (full >= 0).all():
        candidates.append((float(full[0]), float(full[1])))
    for j in (0, 1):
        col = design[:, j]
        denom = float(col @ col)
        value = max(0.0, float(col @ target) / denom) if denom else 0.0
        candidates.append((value, 0.0) if j == 0 else (0.0, value))
    return min(candidates, key=lambda ab: float(np.sum((design @ np.array(ab) - target) ** 2)))


def stale(backend: Backend, curve: CostCurve) -> bool:
    """Whether a cached curve's single-token cost is more than STALE_RATIO times what a short probe
    measures now (a curve timed on a loaded host would make every draft look cheap or dear). Only
    that direction: a probe slowed by load now must not throw away a curve measured quietly.
    Probed only on an empty backend (at load time): one holding a request's cache would have to
    read it again after the probe."""
    if backend.num_cached:
        return False
    probe = measure(backend, (1,), context_len=PROBE_CONTEXT, repeats=PROBE_REPEATS, max_n=1).ms(1)
    return curve.ms(1, PROBE_CONTEXT) > STALE_RATIO * probe


def load_or_measure(
    backend: Backend,
    *,
    thorough: bool = False,
    refresh: bool = False,
    max_n: int = MAX_N,
    progress: Progress | None = None,
) -> CostCurve:
    """The cached curve for this backend, measuring it (quick or thorough) if absent; `progress`
    hears of the measurement's rounds (never called when the cached curve serves)."""
    path = cache_file(backend)
    if path.is_file() and not refresh:
        data = json.loads(path.read_text())
        curve = CostCurve.from_dict(data)
        # A curve measured for shorter drafts than the policy plans now is measured again.
        wanted = max(_points(backend, thorough, max_n))
        # ... and so is one timed at shorter contexts than the window now holds (an older grid).
        longest = max(contexts_for(backend, wanted))
        if (
            (not thorough or data.get("thorough"))
            and curve.max_n >= wanted
            and data.get("longest_context", LEGACY_LONGEST) >= longest
            and not stale(backend, curve)
        ):
            return curve
    points = _points(backend, thorough, max_n)
    contexts = contexts_for(backend, max(points))
    curve = measure_grid(
        backend,
        points,
        contexts=contexts,
        repeats=THOROUGH_REPEATS if thorough else QUICK_REPEATS,
        max_n=max_n,
        progress=progress,
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
                "longest_context": max(contexts),
                "backend": backend.name,
                "identity": backend.identity,
                "threads": backend.n_threads,
            }
        )
    )
    tmp.replace(path)
    return curve
