"""What a target forward costs: the calibrated curve (calibrate.py) corrected online for
machine load and per batch size (TargetTime), and the smoothed ratio both use (Scale).
"""

from __future__ import annotations

from draftwise.calibrate import CostCurve, load_or_measure

# The longest draft planned: past 64 rows a fully accepted draft gains a few percent more per
# forward while a miss costs ~25 plain steps (docs/design.md section 7; docs/bench/code-edit-long/).
MAX_K = 64
# Smoothing of the observed/calibrated target time: machine load (fast, every forward) and the
# per-batch-size shape (slow, so timing noise cannot swing k): `draftwise replay --noise 0.15`
# measures the choices under noise (docs/design.md section 7; docs/bench/drafters-full-E/).
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


def shape_bucket(n: int) -> int:
    """The forwards whose calibration error is learned together: 1, 2, then 3-4, 5-8, ..., 33-64,
    65-128 rows by their upper end. The policy picks k from a continuum, so one size alone is
    seen too seldom for its correction to move; a bucket's sizes share the kernels' behaviour.
    Example: shape_bucket(17) == shape_bucket(32) == 32."""
    return 1 << max(0, n - 1).bit_length()


class TargetTime:
    """The target's forward time over n rows: calibrated curve x load x shape(n).

    The load (the shared machine speeding up or slowing down) moves fast; shape(n), how far
    the calibration is off for a bucket of batch sizes (shape_bucket) relative to a plain step
    (shape(1) = 1), is a
    property of the model and moves slowly, so a few noisy verifications cannot swing the
    choice of k. One per engine: every request's policy reads and feeds the same one, and a
    batched forward over several requests' rows is observed once, at its total rows: rows, not
    sequences, set the cost on llama.cpp (docs/design.md section 7).
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
        shape = self.shapes.get(shape_bucket(n))
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
            shape = self.shapes.setdefault(shape_bucket(n), Scale(alpha=SHAPE_ALPHA))
            shape.update(ms, calibrated * self.load.value)
