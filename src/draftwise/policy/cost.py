"""What a target forward costs: the calibrated curve (calibrate.py) corrected online for
machine load (Scale) and per rows x context bucket from the run's own forwards
(policy/prices.py), in TargetTime.
"""

from __future__ import annotations

from pathlib import Path

from draftwise.calibrate import CostCurve, cache_file, load_or_measure
from draftwise.policy.prices import PriceBook, prices_file, shape_bucket

__all__ = ["MAX_K", "Scale", "TargetTime", "shape_bucket"]

# The longest draft planned: past 64 rows a fully accepted draft gains a few percent more per
# forward while a miss costs ~25 plain steps (docs/design.md section 7; docs/bench/code-edit-long/).
MAX_K = 64
# Smoothing of the observed/calibrated target time of every forward (machine load): `draftwise
# replay --noise 0.15` measures the choices under noise (docs/design.md section 7;
# docs/bench/drafters-full-E/). The prices per rows x context are medians (policy/prices.py).
LOAD_ALPHA = 0.1
# One forward moves the load toward at most this factor of its value (a 3x slow forward: +5%).
LOAD_STEP = 1.5
# Forwards over several rows between two saves of the prices beside the cached curve.
SAVE_EVERY = 32


class Scale:
    """Smoothed ratio of observed time to the calibrated (unscaled) prediction."""

    def __init__(self, alpha: float = 0.1, value: float = 1.0) -> None:
        self.value, self.alpha = value, alpha

    def update(self, observed: float, calibrated: float) -> None:
        if calibrated > 0 and observed > 0:
            ratio = min(max(observed / calibrated, 0.2), 5.0)
            self.value += self.alpha * (ratio - self.value)


class TargetTime:
    """The target's forward time over n rows at a context: calibrated curve x load x price(n, c).

    The load (the shared machine speeding up or slowing down) moves fast; price(n, c), how far
    the calibration is off for a bucket of rows x context (prices.PriceBook) relative to a plain
    step (1 for one row), is the median of the bucket's last forwards, so one disturbed forward
    cannot swing the choice of k, and a host's next run starts from it: it is kept beside the
    cached curve (prices.prices_file) every SAVE_EVERY forwards. One per engine: every request's
    policy reads and feeds the same one, and a batched forward over several requests' rows is
    observed once, at its total rows: rows, not sequences, set the cost on llama.cpp
    (docs/design.md section 7).
    """

    def __init__(
        self, target=None, curve: CostCurve | None = None, *, max_n: int = MAX_K + 1, book: PriceBook | None = None
    ) -> None:
        if curve is None and target is None:
            raise ValueError("the auto policy needs a target cost curve or a target backend to calibrate")
        self.target, self._curve, self.max_n = target, curve, max_n
        self.load = Scale(alpha=LOAD_ALPHA)
        self._book = book
        self._num_priced = 0

    @property
    def curve(self) -> CostCurve:
        if self._curve is None:
            self._curve = load_or_measure(self.target, max_n=self.max_n)
        return self._curve

    @property
    def book(self) -> PriceBook:
        """The prices learnt so far, starting from the host's last run's where one was kept."""
        if self._book is None:
            path = self._book_path()
            self._book = PriceBook.load(path, self.curve) if path is not None else PriceBook()
        return self._book

    def _book_path(self) -> Path | None:
        """Beside the target's cached curve; None without a target (a curve given: a replay, a test)."""
        return prices_file(cache_file(self.target)) if self.target is not None else None

    def shape(self, n: int, context: int | None = None) -> float:
        return 1.0 if n <= 1 else self.book.factor(n, context)

    def ms(self, n: int, context: int | None = None) -> float:
        """Calibrated cost over n rows attending to `context` tokens (None: the calibration's own
        context), corrected by the observed load and (once seen) this bucket's price."""
        return self.curve.ms(n, context) * self.load.value * self.shape(n, context)

    def observe(self, n: int, ms: float, context: int | None = None) -> None:
        """A forward over n rows attending to `context` tokens (a batch: its sequences' mean) took ms."""
        calibrated = self.curve.ms(n, context)
        if calibrated <= 0 or ms <= 0:
            return
        # A forward of a bucket not yet priced teaches its price, not the load: 12% dearer rows
        # would otherwise lift the load first and be learnt as 8% dearer against it. A slow
        # forward moves the load toward at most LOAD_STEP of itself: one burst of a neighbour is
        # not the machine slowing down, and the prices below are read against it.
        if n <= 1 or self.book.knows(n, context):
            ratio = ms / (calibrated * self.shape(n, context))
            value = self.load.value
            self.load.update(min(max(ratio, value / LOAD_STEP), value * LOAD_STEP), 1.0)
        if n > 1:  # prices are relative to a plain step, which defines the load
            self.book.observe(n, context, ms / (calibrated * self.load.value))
            self._num_priced += 1
            if self.target is not None and self._num_priced % SAVE_EVERY == 0:
                self.book.save(self._book_path(), self.curve)
