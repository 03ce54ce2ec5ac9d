"""The `auto` policy: per step, the drafter and k that maximise expected tokens per second.

For each candidate (drafter, k), including k = 0 (plain decoding), expected committed
tokens E(k) = 1 + sum_j prod_{i<=j} c_i from per-position conditional acceptance
estimates c_i, divided by expected time = draft cost(k) + target cost(k + 1) from
calibrated cost curves, rescaled online by how long steps really took.

Free drafters (lookups) are scored on every step, taken or not: each proposal is compared
with the tokens the target commits next (shadow scoring), so a drafter's estimate follows
the text even while the policy decodes plainly, and covers positions beyond the k it
drafted. For a deterministic proposal this is exact under sampling too: the target accepts
token x with probability p(x), the chance that the committed token is x.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from draftwise.backends.base import common_prefix_length
from draftwise.calibrate import CostCurve, load_or_measure
from draftwise.drafters.base import Drafter
from draftwise.policy import Plan, PlanState
from draftwise.types import SpeculationConfig, StepStats

MAX_K = 32
# Speculate only when the expected rate beats plain decoding by this factor: estimates are
# noisy and a marginal win is not worth the risk of a loss (nor the numerics drift).
MIN_GAIN = 1.05
# A free drafter whose lookup costs more than this share of a plain step, and whose proposal
# was not taken, is consulted less often: every 2nd, 4th, ... up to MAX_BACKOFF-th step.
LOOKUP_SHARE = 0.01
MAX_BACKOFF = 8
# Prior conditional acceptance of an n-gram proposal by the length of the matched suffix.
NGRAM_BUCKETS = (1, 2, 3, 4, 5, 8, 16, 32)
NGRAM_PRIORS = (0.25, 0.35, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9)
DRAFT_MODEL_PRIOR = 0.7
# ESTIMATE_KEYS: a free drafter's estimate is keyed by its name, proposal kind and match
# length only, whatever the other lookups propose. Keying it also by agreement with the
# other lookups (tried 2026-11-30) split it into slowly learned parts: replayed on the full suite,
# the three-lookup set lost 1 point of speedup overall and 3 on summarization, and fell
# below its best member; without it, it equals it.

# Smoothing of the observed/calibrated target time: machine load (all steps), and the
# per-batch-size correction of the calibrated curve. Replaying the suite's answers under
# 15% per-step timing noise (`draftwise replay --noise 0.15`), a per-size scale
# with alpha 0.3 lost 2 points of speedup to noisy choices against the noise-free replay;
# this split lost 1 (measured runs here, whose noise is not per-step, did not change).
LOAD_ALPHA = 0.1
SHAPE_ALPHA = 0.03
# Proposals awaiting the committed tokens that score them (shadow scoring), at most.
MAX_SHADOWS = 64


def best_case_draft_speedup(target_cost: CostCurve, draft_cost: CostCurve, max_k: int = MAX_K) -> tuple[float, int]:
    """(speedup over plain decoding, k) of a draft model whose every token is accepted: the most
    it could ever gain on this machine. Drafting k tokens costs k draft forwards of one token;
    verifying them one target forward of k + 1. Example: a draft at 0.7 of a target token and
    verification of k tokens at 0.6 k target tokens -> below 1 for every k: it can never pay.
    """
    plain = target_cost.ms(1)
    best, best_k = 0.0, 0
    for k in range(1, max_k + 1):
        rate = (k + 1) / (draft_cost.ms(1) * k + target_cost.ms(k + 1))
        if rate * plain > best:
            best, best_k = rate * plain, k
    return best, best_k


def ngram_bucket(match_length: float) -> int:
    """Index of the bucket for a matched-suffix length. Example: 6 -> 4 (the 5..7 bucket)."""
    index = 0
    for i, lower in enumerate(NGRAM_BUCKETS):
        if match_length >= lower:
            index = i
    return index


@dataclass
class AcceptanceEstimate:
    """Smoothed c_i = P(draft token i accepted | tokens before it accepted), per position.

    Only positions the verifier actually judged are observed: after the first rejection
    later positions say nothing. Old observations decay so the estimate follows the text.
    """

    prior: float
    prior_weight: float = 3.0
    decay: float = 0.9
    hits: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)

    def rate(self, i: int) -> float:
        if i < len(self.trials):
            return (self.hits[i] + self.prior * self.prior_weight) / (self.trials[i] + self.prior_weight)
        if self.trials:
            # NOTE: positions never drafted yet borrow the last observed rate rather than the
            # prior; otherwise k could never grow past the positions it has already tried.
            return self.rate(len(self.trials) - 1)
        return self.prior

    def update(self, num_drafted: int, num_accepted: int) -> None:
        for i in range(min(num_drafted, num_accepted + 1)):
            while len(self.trials) <= i:
                self.trials.append(0.0)
                self.hits.append(0.0)
            self.trials[i] = self.trials[i] * self.decay + 1.0
            self.hits[i] = self.hits[i] * self.decay + float(i < num_accepted)

    def expected_tokens(self, k: int) -> list[float]:
        """[E(0), E(1), ..., E(k)]: expected committed tokens when drafting j tokens."""
        out, survive, total = [1.0], 1.0, 1.0
        for i in range(k):
            survive *= self.rate(i)
            total += survive
            out.append(total)
        return out

    def summary(self, n: int = 8) -> list[float]:
        return [round(self.rate(i), 3) for i in range(n)]


@dataclass(frozen=True)
class _Shadow:
    """A free drafter's proposal made when the context had `start` tokens."""

    key: tuple[str, int]
    start: int
    token_ids: tuple[int, ...]


class _Scale:
    """Smoothed ratio of observed time to the calibrated (unscaled) prediction."""

    def __init__(self, alpha: float = 0.1, value: float = 1.0) -> None:
        self.value, self.alpha = value, alpha

    def update(self, observed: float, calibrated: float) -> None:
        if calibrated > 0 and observed > 0:
            ratio = min(max(observed / calibrated, 0.2), 5.0)
            self.value += self.alpha * (ratio - self.value)


class AutoPolicy:
    name = "auto"

    def __init__(self, target=None, *, target_cost: CostCurve | None = None,
                 draft_costs: dict[str, CostCurve] | None = None, max_k: int = MAX_K,
                 calibrate: bool = True, lookup_share: float = LOOKUP_SHARE) -> None:
        self.target = target
        self.lookup_share = lookup_share
        self.target_cost = target_cost
        self.draft_costs = dict(draft_costs or {})
        self.max_k = max_k
        self.calibrate = calibrate
        self._drafters: list[Drafter] = []
        self._estimates: dict[tuple[str, int], AcceptanceEstimate] = {}
        # Observed target time = calibrated(n) x load x shape(n). The load (the shared machine
        # speeding up or slowing down) moves fast; shape(n), how far the calibration is off
        # for one batch size relative to a plain step (shape(1) = 1), is a property of the
        # model and moves slowly, so a few noisy verifications cannot swing the choice of k.
        self._target_scale = _Scale(alpha=LOAD_ALPHA)
        self._target_shape: dict[int, _Scale] = {}
        self._draft_scale: dict[str, _Scale] = {}
        # (estimate key the verdict updates, calibrated draft ms): a key only for a model
        # drafter; free drafters' estimates are updated by shadow scoring instead.
        self._last: tuple[tuple[str, int] | None, float] | None = None
        self._lookup_ms: dict[str, float] = {}  # smoothed propose() time of free drafters
        self._backoff: dict[str, int] = {}  # current back-off interval in steps
        self._skip: dict[str, int] = {}  # steps left before the next consultation
        self._shadows: list[_Shadow] = []  # proposals not yet scored against committed tokens
        self.last_decision: dict = {}

    # ---------------------------------------------------------------- set-up
    def begin(self, drafters: Sequence[Drafter], speculation: SpeculationConfig) -> None:
        self._drafters = list(drafters) if speculation.enabled else []
        self._shadows.clear()  # a new request: earlier proposals refer to another context
        if self.target_cost is None:
            if self.target is None or not self.calibrate:
                raise ValueError("the auto policy needs a target cost curve or a target backend to calibrate")
            self.target_cost = load_or_measure(self.target, max_n=self.max_k + 1)
        for d in self._drafters:
            backend = getattr(d, "backend", None)
            if backend is not None and d.name not in self.draft_costs:
                if not self.calibrate:
                    raise ValueError(f"the auto policy needs a cost curve for drafter {d.name!r}")
                self.draft_costs[d.name] = load_or_measure(backend, max_n=self.max_k)

    def _estimate(self, key: tuple[str, int], prior: float) -> AcceptanceEstimate:
        est = self._estimates.get(key)
        if est is None:
            est = self._estimates[key] = AcceptanceEstimate(prior=prior)
        return est

    def _shape(self, n: int) -> float:
        shape = self._target_shape.get(n)
        return shape.value if shape is not None else 1.0

    def _target_ms(self, n: int) -> float:
        """Calibrated cost, corrected by the observed load and (once seen) this size's shape."""
        return self.target_cost.ms(n) * self._target_scale.value * self._shape(n)

    # ---------------------------------------------------------------- planning
    def _score_shadows(self, context: Sequence[int]) -> None:
        """Settle proposals whose outcome the committed tokens now decide: the first
        mismatch, or every token matched."""
        pending = []
        for shadow in self._shadows:
            known = context[shadow.start : shadow.start + len(shadow.token_ids)]
            matched = common_prefix_length(known, shadow.token_ids)
            if matched < len(known):
                self._estimates[shadow.key].update(matched + 1, matched)
            elif matched == len(shadow.token_ids):
                self._estimates[shadow.key].update(matched, matched)
            else:
                pending.append(shadow)
        self._shadows = pending[-MAX_SHADOWS:]

    def plan(self, state: PlanState) -> Plan:
        self._score_shadows(state.context)
        plain_ms = self._target_ms(1)
        # Grammar-forced tokens ride in this step's forward whatever is drafted: rates count
        # them and their rows (m = 0 without a constraint).
        m = state.num_forced
        best_rate, best = MIN_GAIN * (m + 1) / self._target_ms(m + 1), Plan(None, 0)
        best_info: tuple = (None, 0.0)
        k_cap = min(self.max_k, state.max_k)
        consulted: list[Drafter] = []
        for drafter in self._drafters if k_cap > 0 else ():
            if not drafter.free:
                continue
            if self._skip.get(drafter.name, 0) > 0:
                self._skip[drafter.name] -= 1
                continue
            # Free drafters propose first: the proposal's length and match bound k.
            t0 = time.perf_counter()
            draft = drafter.propose(state.context, k_cap, state.grammar)
            if state.grammar is not None and len(draft):
                # A lookup's tokens past the grammar would be rejected for certain: drop them.
                draft = draft.truncated(state.grammar.valid_prefix(draft.token_ids))
            elapsed = 1000 * (time.perf_counter() - t0)
            previous = self._lookup_ms.get(drafter.name, elapsed)
            self._lookup_ms[drafter.name] = previous + 0.2 * (elapsed - previous)
            consulted.append(drafter)
            if not len(draft):
                continue
            bucket = ngram_bucket(draft.score)
            # A drafter with several sources (suffix: live context, history) gets an estimate
            # per source: a history match of the same length is right less often. (It does not
            # depend on what the other lookups propose: see ESTIMATE_KEYS.)
            key = (f"{drafter.name}:{draft.kind}" if draft.kind else drafter.name, bucket)
            est = self._estimate(key, NGRAM_PRIORS[bucket])
            self._shadows.append(_Shadow(key, len(state.context), tuple(draft.token_ids)))
            expected = est.expected_tokens(len(draft))
            for k in range(1, len(draft) + 1):
                t = self._target_ms(m + k + 1)
                if (m + expected[k]) / t > best_rate:
                    best_rate = (m + expected[k]) / t
                    best = Plan(drafter, k, draft.truncated(k))
                    best_info = (None, 0.0)  # shadow scoring covers this proposal
        for drafter in self._drafters if k_cap > 0 else ():
            if drafter.free:
                continue
            key = (drafter.name, 0)
            est = self._estimate(key, DRAFT_MODEL_PRIOR)
            cost = self.draft_costs[drafter.name]
            scale = self._draft_scale.setdefault(drafter.name, _Scale()).value
            backend = getattr(drafter, "backend", None)
            missing = max(1, len(state.context) - (backend.num_cached if backend is not None else 0))
            first_ms = cost.ms(min(missing, cost.max_n)) * scale
            step_ms = cost.ms(1) * scale
            expected = est.expected_tokens(k_cap)
            for k in range(1, k_cap + 1):
                draft_ms = first_ms + step_ms * (k - 1)
                t = draft_ms + self._target_ms(m + k + 1)
                if (m + expected[k]) / t > best_rate:
                    best_rate = (m + expected[k]) / t
                    best = Plan(drafter, k)
                    best_info = (key, draft_ms / scale)  # unscaled
            if best.drafter is drafter and hasattr(drafter, "min_confidence"):
                # Stop drafting when the draft's own confidence is below what one more
                # token must earn: (its draft + verify cost) x the plain rate.
                marginal_ms = step_ms + self._target_ms(m + best.k + 1) - self._target_ms(m + best.k)
                drafter.min_confidence = min(0.95, max(0.0, marginal_ms / plain_ms) * 0.5)
        for drafter in consulted:
            name = drafter.name
            if best.drafter is drafter or self._lookup_ms[name] <= self.lookup_share * plain_ms:
                self._backoff[name] = 0
            else:
                self._backoff[name] = min(MAX_BACKOFF, max(1, 2 * self._backoff.get(name, 0)))
                self._skip[name] = self._backoff[name] - 1
        self._last = best_info
        self.last_decision = {"drafter": best.drafter.name if best.drafter else "none", "k": best.k,
                              "expected_tokens_per_s": 1000 * best_rate}
        return best

    def observe(self, step: StepStats) -> None:
        if self._last is None:
            return
        key, predicted_draft = self._last
        n = step.num_drafted + step.num_forced + 1
        if step.num_branches == 1:
            calibrated = self.target_cost.ms(n)
            self._target_scale.update(step.verify_ms, calibrated * self._shape(n))
            if n > 1:  # shapes are relative to a plain step, which defines the load
                shape = self._target_shape.setdefault(n, _Scale(alpha=SHAPE_ALPHA))
                shape.update(step.verify_ms, calibrated * self._target_scale.value)
        if step.num_drafted and key is not None:
            self._estimates[key].update(step.num_drafted, step.num_accepted)
            if predicted_draft > 0 and key[0] in self._draft_scale:
                self._draft_scale[key[0]].update(step.draft_ms, predicted_draft)
        self._last = None

    def snapshot(self) -> dict:
        return {
            "policy": self.name,
            "target_cost_ms": {n: round(self._target_ms(n), 2) for n in (1, 2, 4, 8, 16, 32)},
            "target_time_scale": round(self._target_scale.value, 3),
            "acceptance": {f"{name}/{bucket}": est.summary() for (name, bucket), est in sorted(self._estimates.items())},
            "draft_time_scale": {name: round(s.value, 3) for name, s in self._draft_scale.items()},
            "lookup_ms": {name: round(ms, 3) for name, ms in self._lookup_ms.items()},
        }

