"""Prices from the run's own forwards: how far a target forward over n rows at a context runs from
the calibrated curve, relative to a one-row forward, per rows x context bucket (PriceBook: the
median of each bucket's last WINDOW observations, robust to a disturbed one), kept beside the
cached curve so a host's next run starts from it (a third of the way from the price that run started
from: RUN_WEIGHT), and the curve corrected by it (CorrectedCurve).
"""

from __future__ import annotations

import json
import os
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from draftwise.calibrate import CostCurve

# 1: {"version", "curve": CostCurve.to_dict() points it corrects, "factors": {"rows:context": f}}
PRICES_VERSION = 1
# Observations per bucket the median is taken over: long enough that one slow forward (a
# neighbour's burst) is outvoted, short enough that a change of the host's state is followed
# within a few dozen forwards of that size.
WINDOW = 24
# A bucket's own median counts from MIN_SEEN observations on (one disturbed forward is never a
# price), in proportion to their number up to FULL_AT, from which on it replaces the bucket's
# prior (a previous run's, else the same rows' at other contexts, else 1): three slow forwards
# move a price a quarter of their way.
MIN_SEEN, FULL_AT = 3, 12
# What one run's learnt prices move the saved ones by (the next run's priors): a third of the way
# from the price the run started from. A run's price is the host's state during that run as much
# as the curve's error: on a 2-core Intel Xeon (AVX-512) two runs of the same edits an hour apart
# priced the rows buckets 3-11% apart, and a run that started from the previous runs' prices in full
# met forwards of 3-4 and 33-64 rows 10-11% dearer than them, 1-4% from the curve's
# (docs/bench/policy-unseen/intel-repeats). Averaged over runs, what persists is the host's own.
RUN_WEIGHT = 1 / 3
# Observed / calibrated is clipped to this range before it enters a window (a forward that was
# interrupted or ran on a stopped machine is not a price).
CLIP = (0.5, 2.0)


def shape_bucket(n: int) -> int:
    """The forwards whose calibration error is learned together: 1, 2, then 3-4, 5-8, ..., 33-64,
    65-128 rows by their upper end. The policy picks k from a continuum, so one size alone is
    seen too seldom for its correction to move; a bucket's sizes share the kernels' behaviour.
    Example: shape_bucket(17) == shape_bucket(32) == 32."""
    return 1 << max(0, n - 1).bit_length()


def context_bucket(context: int | None) -> int:
    """Contexts whose price error is learned together, by their upper end in tokens: up to 1,024,
    then 2,048, 4,096, ... (None: the curve's own context, the first bucket).
    Example: context_bucket(300) == 1024, context_bucket(1500) == 2048."""
    return max(1024, 1 << max(0, (context or 0) - 1).bit_length())


Key = tuple[int, int]  # (shape_bucket(rows), context_bucket(context))


class PriceBook:
    """Per (rows, context) bucket, what forwards cost against the calibrated curve relative to a
    one-row forward, from the bucket's last WINDOW observed factors: their median, weighed
    against the bucket's prior until FULL_AT are in (nothing before MIN_SEEN). The prior is a
    previous run's (`priors`), else the same rows' price at contexts learnt in full, else 1.
    Prices are kept as observed: the policy reads one for every k of every proposal each step.
    Example: after observe(33, 600, 1.12) twelve times, factor(40, 700) == 1.12 and
    factor(40, 3000) == 1.12 (the rows' other context, until 3,000 is seen)."""

    def __init__(self, priors: Mapping[Key, float] | None = None) -> None:
        self.priors: dict[Key, float] = dict(priors or {})
        self.seen: dict[Key, deque[float]] = {}
        self._own: dict[Key, float] = {}  # each bucket's price once MIN_SEEN are in
        self._rows: dict[int, float] = {}  # a rows bucket's median over its contexts learnt in full

    def factor(self, rows: int, context: int | None = None) -> float:
        key = (shape_bucket(rows), context_bucket(context))
        own = self._own.get(key)
        return own if own is not None else self._prior(key)

    def _prior(self, key: Key) -> float:
        prior = self.priors.get(key)
        return prior if prior is not None else self._rows.get(key[0], 1.0)

    def knows(self, rows: int, context: int | None = None) -> bool:
        """Whether this bucket's price is learnt in full (FULL_AT of its own) or taken from a prior."""
        key = (shape_bucket(rows), context_bucket(context))
        return len(self.seen.get(key, ())) >= FULL_AT or key in self.priors or key[0] in self._rows

    def observe(self, rows: int, context: int | None, factor: float) -> None:
        """A forward over `rows` at `context` cost `factor` times its calibrated price."""
        if not factor > 0:
            return
        key = (shape_bucket(rows), context_bucket(context))
        window = self.seen.setdefault(key, deque(maxlen=WINDOW))
        window.append(min(max(factor, CLIP[0]), CLIP[1]))
        if len(window) < MIN_SEEN:
            return
        prior, weight = self._prior(key), min(1.0, len(window) / FULL_AT)
        self._own[key] = prior + weight * (statistics.median(window) - prior)
        full = [f for (r, _), w in self.seen.items() if r == key[0] and len(w) >= FULL_AT for f in w]
        if full:
            self._rows[key[0]] = statistics.median(full)

    def factors(self) -> dict[Key, float]:
        """What a next run starts from: every bucket seen MIN_SEEN times moved RUN_WEIGHT of the
        way from the price this run started from (its prior, else 1: the curve's) to this run's;
        the other priors as they were. Example: prior 1.12, this run's price 0.97 -> 1.07."""
        out = dict(self.priors)
        for key, own in self._own.items():
            start = self.priors.get(key, 1.0)
            out[key] = start + RUN_WEIGHT * (own - start)
        return out

    def save(self, path: Path, curve: CostCurve) -> None:
        """Written aside and renamed (a reader sees the old file or the new one)."""
        data = {
            "version": PRICES_VERSION,
            "curve": [list(p) for p in curve.points],
            "factors": {f"{r}:{c}": round(f, 4) for (r, c), f in sorted(self.factors().items())},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, curve: CostCurve) -> PriceBook:
        """The book saved at path as priors, if it corrects this curve (same points) at this
        version; else an empty one."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls()
        if data.get("version") != PRICES_VERSION or data.get("curve") != [list(p) for p in curve.points]:
            return cls()
        return cls(read_factors(data))


def read_factors(data: dict) -> dict[Key, float]:
    """{"33:1024": 1.1} -> {(64, 1024): 1.1}: a saved book's factors by bucket (rows are bucketed
    again, so a file written by hand may name any rows)."""
    out = {}
    for name, value in (data.get("factors") or {}).items():
        rows, context = (int(v) for v in name.split(":"))
        out[(shape_bucket(rows), context_bucket(context))] = float(value)
    return out


def prices_file(curve_file: Path) -> Path:
    """Where the book correcting a cached curve lives: beside it (<key>.prices.json)."""
    return curve_file.with_suffix(".prices.json")


@dataclass(frozen=True)
class CorrectedCurve(CostCurve):
    """A curve whose forwards cost `book`'s factor times the base curve's (one row: the base's):
    what the run's own forwards taught, as `draftwise replay --prices corrected` prices them."""

    book: PriceBook = field(default_factory=PriceBook, compare=False)

    def ms(self, n: int, context: int | None = None) -> float:
        base = super().ms(n, context)
        return base if n <= 1 else base * self.book.factor(n, context)

    @classmethod
    def of(cls, curve: CostCurve, book: PriceBook) -> CorrectedCurve:
        return cls(
            curve.points,
            curve.context_len,
            "corrected by the host's runs",
            curve.growth,
            curve.growth_one,
            curve.timings,
            book=book,
        )
