"""Live against replay: where a run's measured decode time departs from the calibrated cost model.

A bench record's `step_times` holds, per step, (rows in its forward, context length, forward ms,
step ms). Replay prices a step at curve(rows, context); the measured step differs by
  - cost-curve error: the forward's systematic departure from the curve, per bucket of rows x
    context length (the bucket's median ratio measured/curve, applied to its steps) — e.g. a
    forward that grows with the context the curve was not measured at;
  - noise: what is left of the forward's departure once that is taken out (a shared machine);
  - step overhead: the step's time outside the forward (drafting, masks, verification, commit,
    the loop around the step);
  - other: the decode time outside any step.
The four add up to measured decode time - replayed forward time, exactly.

run_prices turns the cost-curve error into a curve: the calibration scaled, per bucket of rows,
by what this run's forwards took against it, so that a replay and its hindsight optimum can be
priced at what the machine charged during the run instead of during its calibration (a shared
host's neighbours move one row's price and many rows' differently: docs/design.md section 7).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields

from draftwise.bench.reports.grouping import variant_label
from draftwise.calibrate import CostCurve, ScaledCurve

ROW_BUCKETS = (1, 2, 5, 9, 17, 33)  # lower bounds: 1, 2-4, 5-8, 9-16, 17-32, 33+
CONTEXT_BUCKETS = (0, 512, 1024, 2048, 4096, 8192, 16384, 24576)  # lower bounds


def bucket(value: int, bounds: Sequence[int]) -> int:
    """The largest bound <= value. Example: (6, (1, 2, 5, 9)) -> 5."""
    return max(b for b in bounds if b <= value)


@dataclass(frozen=True)
class Split:
    method: str
    num_steps: int
    decode_ms: float  # measured
    replayed_ms: float  # the same steps' forwards on the curve
    curve_error_ms: float
    noise_ms: float
    overhead_ms: float
    other_ms: float

    @property
    def kept(self) -> float:
        """Replayed / measured time: the share of the replay's speed the live run kept."""
        return self.replayed_ms / self.decode_ms if self.decode_ms else 0.0


def split(records: Sequence[dict], curve: CostCurve, method: str) -> tuple[Split, list[tuple]]:
    """The split of one method's records, and its table by rows x context bucket:
    (rows from, context from, steps, measured forward ms/step, curve ms/step, ratio)."""
    steps = [(rows, ctx, fwd, total) for r in records for rows, ctx, fwd, total in r.get("step_times", ()) if rows]
    buckets: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for rows, ctx, fwd, _ in steps:
        buckets[bucket(rows, ROW_BUCKETS), bucket(ctx, CONTEXT_BUCKETS)].append((fwd, curve.ms(rows, ctx)))
    ratio = {key: statistics.median(f / c for f, c in pairs) for key, pairs in buckets.items()}
    replayed = sum(curve.ms(rows, ctx) for rows, ctx, _, _ in steps)
    forward = sum(fwd for _, _, fwd, _ in steps)
    systematic = sum(
        (ratio[bucket(rows, ROW_BUCKETS), bucket(ctx, CONTEXT_BUCKETS)] - 1) * curve.ms(rows, ctx)
        for rows, ctx, _, _ in steps
    )
    overhead = sum(total - fwd for _, _, fwd, total in steps)
    decode = sum(r["decode_ms"] for r in records)
    result = Split(
        method,
        len(steps),
        decode,
        replayed,
        systematic,
        forward - replayed - systematic,
        overhead,
        decode - forward - overhead,
    )
    table = [
        (
            rows,
            ctx,
            len(pairs),
            sum(f for f, _ in pairs) / len(pairs),
            sum(c for _, c in pairs) / len(pairs),
            ratio[rows, ctx],
        )
        for (rows, ctx), pairs in sorted(buckets.items())
    ]
    return result, table


def splits(results: dict, curve: CostCurve) -> list[tuple[Split, list[tuple]]]:
    """One split per method of a bench results.json whose records carry step_times."""
    by_method: dict[str, list[dict]] = defaultdict(list)
    for r in results.get("records", []):
        if r.get("step_times") and not r.get("error"):
            by_method[variant_label(r)].append(r)
    return [split(rs, curve, method) for method, rs in by_method.items()]


# A bucket of rows with fewer steps than this does not set a price of its own.
MIN_PRICED_STEPS = 5


def run_prices(results: dict, curve: CostCurve) -> ScaledCurve:
    """`curve` scaled per bucket of rows (ROW_BUCKETS) by the median ratio measured/curve of the
    run's forwards in it, every method's steps pooled; the factor is placed at the bucket's
    median rows and interpolated between buckets (held beyond the first and the last). A run
    without step times (or too few in every bucket) gets factor 1.
    Example: one-row steps at 0.8 of the curve and 30-row ones at 0.9 -> 16 rows at about 0.85."""
    by_bucket: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for r in results.get("records", []):
        if r.get("error"):
            continue
        for rows, ctx, fwd, _ in r.get("step_times", ()):
            if rows and fwd > 0:
                by_bucket[bucket(rows, ROW_BUCKETS)].append((rows, fwd / curve.ms(rows, ctx)))
    factors = sorted(
        (float(statistics.median(n for n, _ in pairs)), float(statistics.median(f for _, f in pairs)))
        for pairs in by_bucket.values()
        if len(pairs) >= MIN_PRICED_STEPS
    )
    base = {f.name: getattr(curve, f.name) for f in fields(CostCurve)}
    return ScaledCurve(**base | {"source": "this run's forwards", "factors": tuple(factors)})
