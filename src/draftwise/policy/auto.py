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

The estimates c_i are estimates.py's, the target's time cost.py's; plan_batch (at the end)
plans one forward shared by several requests, and a request alone is the batch of one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from draftwise.backends.base import common_prefix_length, text_marks
from draftwise.calibrate import CostCurve, load_or_measure
from draftwise.drafters.base import Drafter
from draftwise.policy.base import Plan, PlanState
from draftwise.policy.cost import MAX_K, Scale, TargetTime
from draftwise.policy.estimates import AcceptanceEstimate, CopyEstimate, expected_tokens, prompt_kind
from draftwise.types import Draft, SpeculationConfig, StepStats

# Speculate only when the expected rate beats plain decoding by this factor: estimates are
# noisy, and the drafts taken are the ones whose estimate is high, so a marginal win is not worth
# the risk of a loss (nor the numerics drift). In Spec-Bench's math answers the first tokens of
# the drafts taken held 0.64 where 0.79 was expected (the shadows' overall: 0.60 against 0.59).
# 1.10 rather than 1.05, with START_DEBT, lifts the replayed floor of Spec-Bench mini from 0.974x
# to 0.992x on a host where a verification of 3 tokens costs 2.6 plain steps (0.956x to 0.983x
# where it costs 1.7), and moves the development corpus by under 0.5%
# (docs/bench/policy-unseen/epyc-gain/README.md).
MIN_GAIN = 1.10
# A free drafter whose lookup costs more than this share of a plain step, and whose proposal
# was not taken, is consulted less often: every 2nd, 4th, ... up to MAX_BACKOFF-th step.
LOOKUP_SHARE = 0.01
MAX_BACKOFF = 8
# The prior acceptance of a draft model's token, until its own are observed (a drafter may
# declare its own: Drafter.acceptance_prior, as CrossVocabDrafter does).
DRAFT_MODEL_PRIOR = 0.7
# A draft model's acceptance is learnt only from the steps that draft with it, and one priced
# below plain decoding at its estimate would never draft again, wherever the text turned (the
# default 0.5B draft is accepted 96% on new code, yet at its 0.70 prior it was never tried). So
# at a request's start, and after PROBE_AFTER steps without it, a draft model is also offered as
# a probe: at most PROBE_K tokens, each priced at least PROBE_RATE. A probe whose every token is
# accepted is followed by another at the next step, until the estimate drafts by itself or a
# probe misses; each miss doubles the wait before the next, up to PROBE_MAX_AFTER steps. The
# request's first probe and those that follow an accepted one price their catch-up (the draft's
# own prompt; a few tokens) spread over PROBE_AFTER steps; one after a wait prices it whole (the
# text written since, which on a 2-core CPU costs SmolLM2 2.5 target steps for 32 tokens, and
# its prompt of 150 tokens 10).
PROBE_AFTER, PROBE_K, PROBE_RATE, PROBE_MAX_AFTER = 32, 2, 0.9, 256
# Once its first position has PROBE_EVIDENCE judged drafts (decayed) behind it, a probe is priced
# at its estimate plus PROBE_BONUS (up to PROBE_RATE) instead: a draft known to be accepted half
# the time (SmolLM2 on translation, 22%) is not probed at 0.9 in every request.
PROBE_EVIDENCE, PROBE_BONUS = 3.0, 0.15
# Proposals awaiting the committed tokens that score them (shadow scoring), at most.
MAX_SHADOWS = 64
# A copy that resumes after an edit: a lookup's proposal whose source position lies at most
# RESUME_SOURCE tokens past where a copy of RESUME_MIN_COPY+ tokens broke off, made at most
# RESUME_CONTEXT tokens after the break (what the edit wrote instead). It keeps an estimate of its
# own (RESUME_PRIORS): in a whole-file edit the file goes on being copied after each change,
# while a new short match elsewhere mostly diverges soon. 48 tokens, not 16: an answer in prose
# repeats a sentence of its own or of the question (16-30 tokens) and goes on with other words,
# and a "resume" there drafted 15 tokens at a 2-token match (Spec-Bench math, replayed: 0.979x
# plain with 16, 0.994x with 48; docs/bench/policy-unseen/resume-48/README.md).
RESUME_SOURCE, RESUME_CONTEXT, RESUME_MIN_COPY = 64, 64, 48
RESUME_PRIORS = (0.7, 0.75, 0.8, 0.85, 0.88, 0.9, 0.93, 0.95, 0.97, 0.98)
# A token that a copy of DIVERGED_MIN_COPY+ tokens proposed where the text went another way (a
# renamed name, a changed operator) is likely to be wrong again when a copy proposes it later in
# the same answer: the first such token in a proposal is rated by its own record, P(right) =
# (hits + DIVERGED_PRIOR * DIVERGED_WEIGHT) / (trials + DIVERGED_WEIGHT), instead of by the copy's
# match length.
DIVERGED_PRIOR, DIVERGED_WEIGHT, DIVERGED_MIN_COPY = 0.5, 2.0, 16
# The request's ledger of what drafting won or lost against plain decoding (in plain steps, each
# drafted step's committed tokens less its time in plain steps at its own context): while it is in
# the red, a draft must promise LEDGER_SLOPE more gain per plain step lost (up to LEDGER_MAX more), so
# estimates that keep promising more than the text gives (answers about a long document, which
# quote it in short runs) stop costing; a loss fades by LEDGER_FADE a step (over ~20 steps), so
# a long answer that turns to copying drafts again. Wins are not banked: they raise nothing.
LEDGER_SLOPE, LEDGER_MAX, LEDGER_FADE = 0.03, 0.3, 0.95
# A request's ledger starts START_DEBT plain steps in the red: its first drafts are priced from
# what earlier requests taught the estimates, not from its own text, so they must promise more
# (+0.12x, fading with the ledger). A short answer (13-17 tokens of a question answered from
# memory) loses 4-5% on one failed draft at its start.
START_DEBT = 4.0


def draft_speedup(
    target_cost: CostCurve, draft_cost: CostCurve, acceptance: float = 1.0, max_k: int = MAX_K
) -> tuple[float, int]:
    """(speedup over plain decoding, k) of a draft model whose tokens are each accepted with
    probability `acceptance`, at its best k. Drafting k tokens costs k draft forwards of one
    token; verifying them one target forward of k + 1. With acceptance 1 it is the most a draft
    model could ever gain on this machine. Example: a draft at 0.7 of a target token and
    verification of k tokens at 0.6 k target tokens -> below 1 for every k: it can never pay.
    """
    plain = target_cost.ms(1)
    best, best_k = 0.0, 0
    expected = expected_tokens([acceptance] * max_k)
    for k in range(1, max_k + 1):
        rate = expected[k] / (draft_cost.ms(1) * k + target_cost.ms(k + 1))
        if rate * plain > best:
            best, best_k = rate * plain, k
    return best, best_k


@dataclass(frozen=True)
class _Shadow:
    """A free drafter's proposal made when the context had `start` tokens."""

    key: str
    length: float  # the proposal's backward match length
    start: int
    token_ids: tuple[int, ...]
    base: str = ""  # the drafter's name: its breaks are kept by name
    origin: int = -1  # the proposal's source position (Draft.origin)
    diverged_at: int = -1  # where its first diverged token is (-1: none)
    line_starts: tuple[bool, ...] = ()  # which of its tokens start a line


@dataclass
class _Option:
    """One way a request may draft this step: drafter, expected tokens and draft time per k."""

    drafter: Drafter
    expected: list[float]  # E(k) for k = 0..len-1
    first_ms: float = 0.0  # a model drafter: its first token (catching up), then step_ms each
    step_ms: float = 0.0
    draft: Draft | None = None  # a free drafter's proposal
    key: str | None = None  # the estimate a model drafter's verdict updates
    probe: bool = False  # a model drafter's probe (PROBE_*)

    def draft_ms(self, k: int) -> float:
        return 0.0 if k == 0 else self.first_ms + self.step_ms * (k - 1)


@dataclass
class _Menu:
    policy: AutoPolicy
    num_forced: int
    options: list[_Option]
    consulted: list[Drafter]


class AutoPolicy:
    name = "auto"

    def __init__(
        self,
        target=None,
        *,
        target_cost: CostCurve | None = None,
        draft_costs: dict[str, CostCurve] | None = None,
        max_k: int = MAX_K,
        calibrate: bool = True,
        lookup_share: float = LOOKUP_SHARE,
        time: TargetTime | None = None,
        line_ends: frozenset[int] | None = None,
        fences: frozenset[int] = frozenset(),
    ) -> None:
        self.target = target
        # Tokens that end a line, and code fences (backends.base.TextMarks; line_ends None: both
        # read from the target's tokenizer at the first begin()).
        self.line_ends, self.fences = line_ends, fences
        self.lookup_share = lookup_share
        self.draft_costs = dict(draft_costs or {})
        self.max_k = max_k
        self.calibrate = calibrate
        if time is None and (target_cost is not None or (target is not None and calibrate)):
            time = TargetTime(target, target_cost, max_n=max_k + 1)
        self.time = time
        self._drafters: list[Drafter] = []
        self._estimates: dict[str, AcceptanceEstimate] = {}  # draft models'
        self._copies: dict[str, CopyEstimate] = {}  # free drafters', by name and proposal kind
        self._draft_scale: dict[str, Scale] = {}
        # (estimate key the verdict updates, calibrated draft ms): a key only for a model
        # drafter; free drafters' estimates are updated by shadow scoring instead.
        self._last: tuple[str | None, float] | None = None
        self._lookup_ms: dict[str, float] = {}  # smoothed propose() time of free drafters
        self._backoff: dict[str, int] = {}  # current back-off interval in steps
        self._skip: dict[str, int] = {}  # steps left before the next consultation
        self._shadows: list[_Shadow] = []  # proposals not yet scored against committed tokens
        # Per lookup drafter: (source position, context length) where its last long copy broke off.
        self._breaks: dict[str, tuple[int, int]] = {}
        # Diverged tokens of this request: token -> [hits, trials] when proposed again.
        self._diverged: dict[int, list[float]] = {}
        self._context: int | None = None  # the planned step's context length (prices its forward)
        self._since_drafted: dict[str, int] = {}  # a draft model: this request's steps since it drafted
        self._probe_after: dict[str, int] = {}  # ... and the steps it waits for its next probe
        self._probed: set[str] = set()  # the draft models whose next probe prices its catch-up
        self._probing: str | None = None  # the draft model the last step probed
        self._ledger = 0.0  # plain steps drafting lost (< 0) in this request, fading (LEDGER_*)
        self._kind = ""  # the request's kind (estimates.prompt_kind), read from its prompt at its first step
        self.last_decision: dict = {}

    @property
    def target_cost(self) -> CostCurve:
        return self.time.curve

    # ---------------------------------------------------------------- set-up
    def begin(self, drafters: Sequence[Drafter], speculation: SpeculationConfig) -> None:
        self._drafters = list(drafters) if speculation.enabled else []
        self._shadows.clear()  # a new request: earlier proposals refer to another context
        self._breaks.clear()
        self._diverged.clear()
        self._kind = ""
        if self.time is None:
            raise ValueError("the auto policy needs a target cost curve or a target backend to calibrate")
        _ = self.time.curve  # calibrate now (once per model and machine), not inside a step
        self._ledger = -START_DEBT
        self._since_drafted = {d.name: PROBE_AFTER for d in self._drafters if not d.free}  # new text: probe
        self._probe_after = {d.name: PROBE_AFTER for d in self._drafters if not d.free}
        self._probed = set()
        if self.line_ends is None:
            target = self.target
            marks = text_marks(target.tokenizer, target.vocab_size) if target is not None else None
            self.line_ends = marks.line_ends if marks else frozenset()
            self.fences = marks.fences if marks else frozenset()
        for d in self._drafters:
            backend = d.backend
            if backend is not None and d.name not in self.draft_costs:
                if not self.calibrate:
                    raise ValueError(f"the auto policy needs a cost curve for drafter {d.name!r}")
                self.draft_costs[d.name] = load_or_measure(backend, max_n=self.max_k)

    def _estimate(self, key: str, prior: float | tuple[float, ...]) -> AcceptanceEstimate:
        est = self._estimates.get(key)
        if est is None:
            est = self._estimates[key] = AcceptanceEstimate(prior=prior)
        return est

    def _copy(self, key: str) -> CopyEstimate:
        est = self._copies.get(key)
        if est is None:
            est = self._copies[key] = CopyEstimate(RESUME_PRIORS if key.endswith(":resume") else None)
            est.begin_request(self._kind)
        return est

    def _diverged_at(self, draft: Draft) -> int:
        """Where the proposal's first diverged token is; -1: it has none."""
        diverged = self._diverged
        return next((j for j, t in enumerate(draft.token_ids) if t in diverged), -1) if diverged else -1

    def _before_fence(self, draft: Draft) -> Draft:
        """A lookup's proposal ends before a code fence past its first token: an answer that
        copies a code block from its prompt closes its block there and stops, while the prompt
        goes on with other text (the fence itself often tokenised apart: "``" + "`\n\n"), so
        every row verified past it would be a miss."""
        fences = self.fences
        if fences:
            cut = next((j for j in range(1, len(draft)) if draft.token_ids[j] in fences), 0)
            if cut:
                return draft.truncated(cut)
        return draft

    def _line_starts(self, context: Sequence[int], token_ids: Sequence[int]) -> tuple[bool, ...]:
        """Which tokens of a proposal continuing `context` start a line."""
        ends = self.line_ends
        if not ends:
            return ()
        previous = context[-1] if len(context) else -1
        return (previous in ends, *(t in ends for t in token_ids[:-1]))

    def _expected(self, est: CopyEstimate, draft: Draft, at: int, starts: tuple[bool, ...]) -> list[float]:
        """E(0..k) of a lookup's proposal: by its match length and where its lines start, and its
        first diverged token (at, -1: none) by that token's own record."""
        if at < 0:
            return est.expected_tokens(draft.score, len(draft), starts)
        hits, trials = self._diverged[draft.token_ids[at]]
        rates = [est.rate(draft.score, j, j < len(starts) and starts[j]) for j in range(len(draft))]
        rates[at] = (hits + DIVERGED_PRIOR * DIVERGED_WEIGHT) / (trials + DIVERGED_WEIGHT)
        return expected_tokens(rates)

    def _after_break(self, key: str, draft: Draft, context_len: int) -> str:
        """'resume' if `draft` picks up the source where key's last long copy broke off; 'edit' if
        that break is recent but the draft copies from elsewhere (text written in an edit seldom
        continues like another place that happens to match it); '' otherwise."""
        last = self._breaks.get(key)
        if last is None:
            return ""
        source_end, context_end = last
        if not 0 <= context_len - context_end <= RESUME_CONTEXT:
            return ""
        return "resume" if 0 <= draft.origin - source_end <= RESUME_SOURCE else "edit"

    def _target_ms(self, n: int) -> float:
        return self.time.ms(n, self._context)

    @property
    def min_gain(self) -> float:
        """The gain a draft must promise over plain decoding now: MIN_GAIN, more while this
        request's drafting is in the red (LEDGER_*)."""
        return MIN_GAIN + min(LEDGER_MAX, LEDGER_SLOPE * -self._ledger)

    # ---------------------------------------------------------------- planning
    def _score_shadows(self, context: Sequence[int]) -> None:
        """Settle proposals whose outcome the committed tokens now decide: the first
        mismatch, or every token matched."""
        pending = []
        for shadow in self._shadows:
            known = context[shadow.start : shadow.start + len(shadow.token_ids)]
            matched = common_prefix_length(known, shadow.token_ids)
            broke = matched < len(known)
            if not broke and matched < len(shadow.token_ids):
                pending.append(shadow)  # every token known so far matched; more are to come
                continue
            judged = matched + 1 if broke else matched
            at = shadow.diverged_at
            if 0 <= at < judged:  # its diverged token was judged
                record = self._diverged[shadow.token_ids[at]]
                record[0] += at < matched
                record[1] += 1.0
                if at == matched:  # wrong where expected: the copy's own estimate is not at fault
                    self._copies[shadow.key].update(shadow.length, at, at, shadow.line_starts)
                    continue
            self._copies[shadow.key].update(shadow.length, judged, matched, shadow.line_starts)
            if broke and shadow.length + matched >= DIVERGED_MIN_COPY:
                self._diverged.setdefault(shadow.token_ids[matched], [0.0, 0.0])
            if broke and shadow.length + matched >= RESUME_MIN_COPY and shadow.origin >= 0:
                self._breaks[shadow.base] = (shadow.origin + matched, shadow.start + matched)
        self._shadows = pending[-MAX_SHADOWS:]

    def plan(self, state: PlanState) -> Plan:
        return plan_batch([self], [state])[0]

    def menu(self, state: PlanState) -> _Menu:
        """This step's options: free drafters' proposals (consulted now) and draft models."""
        if not self._kind:  # the request's first step: its context is its prompt
            self._kind = prompt_kind(state.context, self.line_ends)
            for est in self._copies.values():
                est.begin_request(self._kind)
        self._score_shadows(state.context)
        self._context = len(state.context)
        k_cap = min(self.max_k, state.max_k)
        options: list[_Option] = []
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
            draft = self._before_fence(draft)
            elapsed = 1000 * (time.perf_counter() - t0)
            previous = self._lookup_ms.get(drafter.name, elapsed)
            self._lookup_ms[drafter.name] = previous + 0.2 * (elapsed - previous)
            consulted.append(drafter)
            if not len(draft):
                continue
            # A drafter with several sources (suffix: live context, history) gets an estimate
            # per source: a history match of the same length is right less often. (It does not
            # depend on what the other lookups propose: see ESTIMATE_KEYS in estimates.py.)
            base = f"{drafter.name}:{draft.kind}" if draft.kind else drafter.name
            key = f"{base}:{self._after_break(drafter.name, draft, len(state.context))}".rstrip(":")
            est = self._copy(key)
            at = self._diverged_at(draft)
            starts = self._line_starts(state.context, draft.token_ids)
            self._shadows.append(
                _Shadow(
                    key, draft.score, len(state.context), tuple(draft.token_ids), drafter.name, draft.origin, at, starts
                )
            )
            options.append(_Option(drafter, self._expected(est, draft, at, starts), draft=draft))
        for drafter in self._drafters if k_cap > 0 else ():
            if not drafter.free:
                options += self._model_options(drafter, state.context, k_cap)
        return _Menu(self, state.num_forced, options, consulted)

    def _model_options(self, drafter: Drafter, context: Sequence[int], k_cap: int) -> list[_Option]:
        """A draft model's options this step: drafting at its estimate, its first token costing its
        catch-up (the tokens its cache lacks, priced at its curve, linearly past the curve's
        largest size) and each further token one draft forward; and, where it has not drafted for
        its probe interval (PROBE_*), a probe too."""
        key = drafter.name
        cost = self.draft_costs[key]
        scale = self._draft_scale.setdefault(key, Scale()).value
        prior = drafter.acceptance_prior or DRAFT_MODEL_PRIOR
        est = self._estimate(key, prior)
        step_ms = cost.ms(1, self._context) * scale
        since = self._since_drafted.get(key, 0)
        self._since_drafted[key] = since + 1
        missing = drafter.catch_up(context)
        first_ms = cost.ms(min(missing, cost.max_n), self._context) * max(1.0, missing / cost.max_n)
        rates = est.rates(k_cap)
        options = [_Option(drafter, expected_tokens(rates), first_ms=first_ms * scale, step_ms=step_ms, key=key)]
        if since >= self._probe_after.get(key, PROBE_AFTER):
            known = (est.trials[0] if est.trials else 0.0) >= PROBE_EVIDENCE
            rates = [max(r, min(PROBE_RATE, r + PROBE_BONUS) if known else PROBE_RATE) for r in rates[:PROBE_K]]
            # After a wait, the probe pays its whole catch-up; else (the request's first probe, whose
            # catch-up is the draft's prompt, and one after an accepted probe) that catch-up is spread
            # over the PROBE_AFTER steps its verdict informs.
            catch_up_ms = max(0.0, first_ms * scale - step_ms)
            probe_first = step_ms + (catch_up_ms if key in self._probed else catch_up_ms / PROBE_AFTER)
            probe = _Option(drafter, expected_tokens(rates), first_ms=probe_first, step_ms=step_ms, key=key, probe=True)
            options.append(probe)
        return options

    def conclude(self, menu: _Menu, option: _Option | None, k: int, rows: int, rate: float) -> Plan:
        """Settle this request's choice (option, k) in a forward of `rows` rows in all."""
        plain_ms = self._target_ms(1)
        if option is None or k == 0:
            best = Plan(None, 0)
        else:
            best = Plan(option.drafter, k, option.draft and option.draft.truncated(k))
        drafter = best.drafter
        if drafter is not None and not drafter.free:
            # Stop drafting when the draft's own confidence is below what one more
            # token must earn: (its draft + verify cost) x the plain rate.
            marginal_ms = option.step_ms + self._target_ms(rows + 1) - self._target_ms(rows)
            drafter.min_confidence = min(0.95, max(0.0, marginal_ms / plain_ms) * 0.5)
        for consulted in menu.consulted:
            name = consulted.name
            if drafter is consulted or self._lookup_ms[name] <= self.lookup_share * plain_ms:
                self._backoff[name] = 0
            else:
                self._backoff[name] = min(MAX_BACKOFF, max(1, 2 * self._backoff.get(name, 0)))
                self._skip[name] = self._backoff[name] - 1
        scale = self._draft_scale.get(drafter.name) if drafter is not None else None
        drafted = option is not None and option.key and k
        if drafted:
            self._since_drafted[drafter.name] = 0
        self._probing = drafter.name if drafted and option.probe else None
        if self._probing:
            self._probed.add(self._probing)
        # A probe's draft time (its catch-up spread over PROBE_AFTER steps, or left out) does not
        # teach the draft's time scale.
        predicted = 0.0 if not drafted or option.probe else option.draft_ms(k) / scale.value
        self._last = (option.key, predicted) if drafted else (None, 0.0)
        self.last_decision = {
            "drafter": drafter.name if drafter else "none",
            "k": best.k,
            "probe": bool(drafted and option.probe),
            "expected_tokens_per_s": 1000 * rate,
        }
        return best

    def observe(self, step: StepStats) -> None:
        if self._last is None:
            return
        key, predicted_draft = self._last
        self._ledger *= LEDGER_FADE  # never above 0: wins only pay a loss back
        if step.num_branches == 1 and not step.batch_rows:
            self.time.observe(step.num_drafted + step.num_forced + 1, step.verify_ms, self._context)
            if step.num_drafted and not step.num_forced:
                plain_ms = self._target_ms(1)
                won = step.num_accepted + 1 - (step.verify_ms + step.draft_ms) / max(1e-9, plain_ms)
                self._ledger = min(0.0, self._ledger + won)
        if step.num_drafted and key is not None:
            self._estimates[key].update(step.num_drafted, step.num_accepted)
            if self._probing == key and step.num_accepted == step.num_drafted:
                self._since_drafted[key] = self._probe_after[key] = PROBE_AFTER  # all accepted: again next step
                self._probed.discard(key)  # ... its catch-up a few tokens, unpriced
            elif self._probing == key:
                self._probe_after[key] = min(PROBE_MAX_AFTER, 2 * self._probe_after[key])
            if predicted_draft > 0 and key in self._draft_scale:
                self._draft_scale[key].update(step.draft_ms, predicted_draft)
        self._last = None

    def snapshot(self) -> dict:
        return {
            "policy": self.name,
            "target_cost_ms": {n: round(self._target_ms(n), 2) for n in (1, 2, 4, 8, 16, 32, 64)},
            "target_time_scale": round(self.time.load.value, 3),
            "acceptance": {name: est.summary() for name, est in sorted(self._estimates.items())},
            "prompt_kind": self._kind,
            "copy_acceptance": {name: est.summary() for name, est in sorted(self._copies.items())},
            "draft_time_scale": {name: round(s.value, 3) for name, s in self._draft_scale.items()},
            "lookup_ms": {name: round(ms, 3) for name, ms in self._lookup_ms.items()},
        }


def plan_batch(policies: Sequence[AutoPolicy], states: Sequence[PlanState], extra_rows: int = 0) -> list[Plan]:
    """Every request's drafter and k for one forward shared by all of them (and extra_rows of
    prompt prefill): the choice that maximises the batch's expected committed tokens per second,
    sum_i (m_i + E_i(k_i)) / (sum_i draft_i(k_i) + T(rows)), rows = sum_i (m_i + k_i + 1) + extra.

    Coordinate ascent from all-plain: each request in turn takes its best option with the
    others fixed, until nothing moves (two or three sweeps; one for a request alone). Plain
    decoding counts MIN_GAIN x its tokens: a request drafts only for a clear win. With one
    request this is the single-request rule: the best of (m + E(k)) / (draft(k) + T(m + k + 1))
    over drafters and k, against MIN_GAIN x plain. In a large batch a drafted row costs nearly a
    whole plain step's share, so k falls (or drafting stops) as the batch grows: the batch's
    goodput, not one request's, is maximised.
    """
    time_model = policies[0].time
    menus = [p.menu(s) for p, s in zip(policies, states)]
    # One forward for all: each row attends to its own sequence, so the batch costs about what
    # its rows cost at the sequences' mean context.
    context = round(sum(len(s.context) for s in states) / len(states))
    choice: list[tuple[_Option | None, int]] = [(None, 0)] * len(menus)

    gains = [p.min_gain for p in policies]

    def value(i: int, option: _Option | None, k: int) -> tuple[float, float, int]:
        m = menus[i].num_forced
        if option is None or k == 0:
            return gains[i] * (m + 1), 0.0, m + 1
        return m + option.expected[k], option.draft_ms(k), m + k + 1

    # The forward's time by rows, each size priced once per call: a batch's sweeps ask for the same
    # sizes once per request, option and sweep.
    forward_ms: dict[int, float] = {}

    def forward(n: int) -> float:
        ms = forward_ms.get(n)
        if ms is None:
            ms = forward_ms[n] = time_model.ms(n, context)
        return ms

    parts = [value(i, None, 0) for i in range(len(menus))]
    for _ in range(3):
        moved = False
        for i, menu in enumerate(menus):
            num = sum(p[0] for p in parts) - parts[i][0]
            draft = sum(p[1] for p in parts) - parts[i][1]
            rows = sum(p[2] for p in parts) - parts[i][2] + extra_rows
            best_rate, best, best_parts = -1.0, choice[i], parts[i]
            for option in [None, *menu.options]:
                for k in range(0 if option is None else 1, 1 if option is None else len(option.expected)):
                    v = value(i, option, k)
                    rate = (num + v[0]) / (draft + v[1] + forward(rows + v[2]))
                    if rate > best_rate:
                        best_rate, best, best_parts = rate, (option, k), v
            if best != choice[i]:
                moved = True
            choice[i], parts[i] = best, best_parts
        if not moved or len(menus) == 1:  # alone, the first sweep's choice is the best of all
            break
    rows = sum(p[2] for p in parts) + extra_rows
    rate = sum(p[0] for p in parts) / (sum(p[1] for p in parts) + forward(rows))
    return [menu.policy.conclude(menu, option, k, rows, rate) for menu, (option, k) in zip(menus, choice)]
