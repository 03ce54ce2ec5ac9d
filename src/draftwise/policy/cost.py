"""What a target forward costs: the calibrated curve (calibrate.py) corrected online for
machine load and per batch size (TargetTime), and the smoothed ratio both use (Scale).
"""

from __future__ import annotations

from draftwise.calibrate import CostCurve, load_or_measure

# The longest draft planned. Measured here (default target, 1,000 tokens of context, ms for n
# rows with all logits): 32 rows 454-465 (4.4-4.7 plain steps' worth of tokens per plain
# step's time), 64 rows 866-884 (4.7-4.9), 96 rows 1,236-1,277 (5.0), 128 rows 1,626-1,772
# (4.7-5.3): past 64 a fully accepted draft gains at most a few percent more, while a miss
# costs 25 plain steps (2026-12-01).
MAX_K = 64
# Smoothing of the observed/calibrated target time: machine load (all steps), and the
# per-batch-size correction of the calibrated curve. Replaying the suite's answers under
# 15% per-step timing noise (`draftwise replay --noise 0.15`), a per-size scale
# with alpha 0.3 lost 2 points of speedup to noisy choices against the noise-free replay;
# this split lost 1 (measured runs here, whose noise is not per-step, did not change).
LOAD_ALPHA = 0.1
SHAPE_ALPHA = 0.03


class Scale:
    """Smoothed ratio of observed time to the calibrated (unscaled) prediction."""

    def __init__(self, alpha: float = 0.1, value: float = 1.0) -> None:
        self.value, self.alpha = value, alpha

    def update(self, observed: float, calibrated: float) -> None:
        if calibrated > 0 and observed > 0:
            ratio = min(max(observed / calibrated, 0.2), 5.0)
            self.value += self.alpha * (ratio - self.value)


class TargetTime:
    """The target's forward time over n rows: calibrated curve x load x shape(n).

    The load (the shared machine speeding up or slowing down) moves fast; shape(n), how far
    the calibration is off for one batch size relative to a plain step (shape(1) = 1), is a
    property of the model and moves slowly, so a few noisy verifications cannot swing the
    choice of k. One per engine: every request's policy reads and feeds the same one, and a
    batched forward over several requests' rows is observed once, at its total rows. Rows, not
    sequences, set the cost on llama.cpp here (default target, 300 cached tokens per sequence):
    8 rows 199 / 197 / 201 ms as 1 x 8, 4 x 2 and 5 + 1 + 1 + 1; 16 rows 260 / 246 / 240 ms;
    32 rows 433 / 413 ms as 1 x 32 and 4 x 8 (2026-12-01).
    """

    def __init__(self, target=None, curve: CostCurve | None = None, *, max_n: int = MAX_K + 1) -> None:
        if curve is None and target is None:
            raise ValueError("the auto policy needs a target cost curve or a target backend to calibrate")
        self.target, self._curve, self.max_n = target, curve, max_n
        self.load = Scale(alpha=LOAD_ALPHA)
        self.shapes: dict[int, Scale] = {}

    @property
    def curve(self) -> CostCurve:
        if self._curve is None:
            self._curve = load_or_measure(self.target, max_n=self.max_n)
        return self._curve

    def shape(self, n: int) -> float:
        shape = self.shapes.get(n)
        return shape.value if shape is not None else 1.0

    def ms(self, n: int, context: int | None = None) -> float:
        """Calibrated cost over n rows attending to `context` tokens (None: the calibration's own
        context), corrected by the observed load and (once seen) this size's shape."""
        return self.curve.ms(n, context) * self.load.value * self.shape(n)

    def observe(self, n: int, ms: float, context: int | None = None) -> None:
        """A forward over n rows attending to `context` tokens (a batch: its sequences' mean) took ms."""
        calibrated = self.curve.ms(n, context)
        self.load.update(ms, calibrated * self.shape(n))
        if n > 1:  # shapes are relative to a plain step, which defines the load
            shape = self.shapes.setdefault(n, Scale(alpha=SHAPE_ALPHA))
            shape.update(ms, calibrated * self.load.value)
