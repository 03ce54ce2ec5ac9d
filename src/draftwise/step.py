"""One speculative step for a batch of requests, as six named phases:

    force -> plan -> draft -> forward -> verify -> commit

Each phase says what it reads and what it changes, and hands the next one a small frozen
value (Ready, Drafted, Verified). The target forward is the batch's one shared act; every
other phase runs per request, and an exception there ends that request alone (its outcome
is the exception) while the others go on with their caches and answers untouched.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from draftwise.backends.base import Backend, extend_batch
from draftwise.constraints import masked
from draftwise.policy.auto import AutoPolicy, plan_batch
from draftwise.policy.base import Plan, PlanState
from draftwise.request import RunningRequest
from draftwise.sampling import History, LazyTargetProbs, TokenLogprob, choose_greedy, logprobs
from draftwise.types import Draft, StepStats, TreeDraft, Verdict
from draftwise.verify import greedy_verify, greedy_verify_tree, rejection_sample

# What the step yields per request: tokens to commit (the caller applies stop conditions),
# None when nothing fits any more (context window or max_tokens), or the error that ended it.
Outcome = list[int] | None | Exception
# A prompt chunk in the forward: (sequence, ids) or (sequence, ids, request asking for prompt logprobs).
Prefill = tuple[Backend, Sequence[int]] | tuple[Backend, Sequence[int], RunningRequest | None]
T, U = TypeVar("T"), TypeVar("U")
log = logging.getLogger(__name__)
_joint_plan_failures: set[type] = set()  # exception types already warned about (once each)


@dataclass(frozen=True)
class Ready:
    """force -> plan: what this step may draft after the forced tokens."""

    forced: tuple[int, ...]  # grammar-forced tokens, committed with no decision
    context: Sequence[int]  # committed + forced tokens
    max_k: int  # the most draft tokens that fit (context window, max_tokens)


@dataclass(frozen=True)
class Drafted:
    """draft -> forward -> verify: the proposal to check (empty: a plain step)."""

    ready: Ready
    plan: Plan
    draft: Draft | TreeDraft
    draft_ms: float  # this request's share of planning + its drafting


@dataclass(frozen=True)
class Verified:
    """verify -> commit: the verifier's decision on the chain it checked."""

    drafted: Drafted
    verdict: Verdict
    draft_ids: tuple[int, ...]  # the verified chain (a tree's winning branch)
    branch: int | None = None  # the tree branch kept; None for a chain
    logprobs: tuple[TokenLogprob, ...] = ()  # forced + committed tokens', when the request asks


@dataclass(frozen=True)
class Forward:
    """forward -> commit: what the shared forward cost (verify reads its logits rows)."""

    ms: float
    rows: int
    batched: bool  # several items (requests or prefill chunks) shared it


@dataclass(frozen=True)
class StepResult:
    outcomes: list[Outcome]  # per request, in the order given
    rows: int = 0  # target rows in the forward (0: none ran)
    forward_error: Exception | None = None  # the shared forward failed: every item in it ends
    # Prefills whose prompt could not be scored (by index in `prefills`): those requests end alone.
    prefill_errors: dict[int, Exception] = field(default_factory=dict)
    # Milliseconds per phase (force, plan, draft, forward, verify, commit, and masks: the grammar
    # masks computed while forcing and verifying, taken out of those two): the time account.
    phase_ms: dict[str, float] = field(default_factory=dict)


class PhaseClock:
    """Milliseconds per phase, accumulated over a step: `with clock("draft") as lap: ...`;
    lap.ms is that one interval."""

    @dataclass
    class Lap:
        ms: float = 0.0

    def __init__(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[Lap]:
        lap, t0 = PhaseClock.Lap(), time.perf_counter()
        try:
            yield lap
        finally:
            lap.ms = 1000 * (time.perf_counter() - t0)
            self.ms[phase] += lap.ms

    @contextmanager
    def masks(self, phase: str, reqs: Sequence[RunningRequest]) -> Iterator[None]:
        """Move the grammar-mask time the requests' grammars count inside `phase` to "masks"."""
        grammars = [r.grammar for r in reqs if r.grammar is not None]
        before = sum(g.mask_ms for g in grammars)
        try:
            yield
        finally:
            spent = sum(g.mask_ms for g in grammars) - before
            self.ms[phase] -= spent
            self.ms["masks"] += spent


def step(
    target: Backend,
    reqs: Sequence[RunningRequest],
    prefills: Sequence[Prefill] = (),
    *,
    trees: bool = False,
    target_time=None,
) -> StepResult:
    """One step for each request with one target forward for all of them. `prefills`
    (sequence, ids[, request]) ride in the same forward without logits (chunked prefill of
    joining requests), or with a row each where the request asks for prompt logprobs. trees:
    the batch is one request that may verify several branches (decided by the caller, before
    the step). target_time: the auto policies' shared cost model, told what a batched forward
    cost."""
    out: list[Outcome] = [None] * len(reqs)
    clock = PhaseClock()
    ready = {}
    with clock("force"), clock.masks("force", reqs):
        forcing = _each(out, dict(enumerate(reqs)), lambda i, req: force(req))
    for i, forced in forcing.items():
        if isinstance(forced, Ready):
            ready[i] = forced
        else:
            out[i] = forced  # the forced tokens end the request, or nothing fits
    if not ready and not prefills:
        return StepResult(out, phase_ms=dict(clock.ms))
    with clock("plan") as planning:
        plans = plan({i: (reqs[i], r) for i, r in ready.items()}, sum(len(item[1]) for item in prefills), out)
    plan_share = planning.ms / max(1, len(plans))

    def draft_one(i: int, p: Plan) -> Drafted:
        with clock("draft") as lap:
            proposal = draft(reqs[i], ready[i], p, trees)
        return Drafted(ready[i], p, proposal, plan_share + lap.ms)

    drafted = _each(out, plans, draft_one)
    rows = sum(_rows(reqs[i], d) for i, d in drafted.items()) + sum(len(item[1]) for item in prefills)
    try:
        with clock("forward") as lap:
            logits = forward(target, [(reqs[i], d) for i, d in drafted.items()], prefills)
    except Exception as exc:  # a shared act: no one request to blame
        for i in drafted:
            out[i] = exc
        return StepResult(out, forward_error=exc, phase_ms=dict(clock.ms))
    prefill_errors = score_prompts(prefills, logits[len(drafted) :])
    logits = logits[: len(drafted)]
    fwd = Forward(lap.ms, rows, len(drafted) + len(prefills) > 1)
    if fwd.batched and target_time is not None:
        # The shared forward, once at its total rows and its sequences' mean context.
        contexts = [len(d.ready.context) for d in drafted.values()]
        target_time.observe(rows, fwd.ms, round(sum(contexts) / len(contexts)) if contexts else None)
    row_logits = dict(zip(drafted, logits))
    with clock("verify"), clock.masks("verify", reqs):
        verified = _each(out, drafted, lambda i, d: verify(reqs[i], d, row_logits[i]))
    with clock("commit"):
        committed = _each(out, verified, lambda i, v: commit(reqs[i], v, fwd, len(drafted)))
    for i, tokens in committed.items():
        out[i] = tokens
    return StepResult(out, rows, phase_ms=dict(clock.ms), prefill_errors=prefill_errors)


def _each(out: list[Outcome], items: dict[int, T], phase: Callable[[int, T], U]) -> dict[int, U]:
    """phase(i, value) for each request still in the step; an exception ends request i alone
    (out[i] holds it) and the others go on."""
    done: dict[int, U] = {}
    for i, value in items.items():
        try:
            done[i] = phase(i, value)
        except Exception as exc:
            out[i] = exc
    return done


# ---------------------------------------------------------------------- the phases
def force(req: RunningRequest) -> Ready | list[int] | None:
    """1. Forced tokens. Reads the grammar at the committed context; where it allows a single
    token, that token's masked probability is 1, so it is committed with no decision and the
    target needs only its KV entry, which this step's forward writes (no logits row unless the
    request asks for logprobs: then the forward returns the rows before them too, and forced
    tokens that would end the request leave their last one to a row). Changes: the grammar
    (consumes them) and the forced-token count. Plain decoding (speculation off) decodes them
    one per forward like any other token.

    Returns what the step may draft (Ready), or the request's last tokens when forced tokens
    end it, or None when nothing fits."""
    target, grammar = req.slot.target, req.grammar
    remaining = req.sampling.max_tokens - len(req.generated)
    scored = req.sampling.logprobs is not None
    forced = []
    if grammar is not None and req.fast_forward:
        # Scored, the request's last token is decided by a row (probability 1), which its logprob
        # needs: the grammar forces (and consumes) at most one token fewer than max_tokens allows.
        forced = grammar.forced(min(remaining - scored, target.n_ctx - len(req.context)))
    ends = forced and (forced[-1] in grammar.eos_token_ids or len(forced) >= remaining)
    if ends and scored:
        forced = forced[:-1]  # a forced EOS, which forced() leaves unconsumed: a row decides it
    req.stats.num_forced_tokens += len(forced)
    if ends and not scored:
        req.pending_sources, req.pending_step = ("grammar",) * len(forced), (0, 0)
        return forced
    context = req.context + forced if forced else req.context
    max_k = min(target.n_ctx - len(context), remaining - len(forced) - 1)  # never past either
    if max_k < 0:
        return forced or None
    return Ready(tuple(forced), context, max_k)


def plan(items: dict[int, tuple[RunningRequest, Ready]], extra_rows: int, out: list[Outcome]) -> dict[int, Plan]:
    """2. Plan: which drafter and how many tokens each request drafts. Reads the policies'
    estimates; changes nothing but what a policy keeps of its own planning (free drafters
    propose while it plans). Auto policies of one engine choose jointly for the shared forward;
    if the joint plan fails, each request plans alone, so a failure ends only its request."""
    states = {
        i: PlanState(context=r.context, max_k=r.max_k, greedy=req.greedy, grammar=req.grammar, num_forced=len(r.forced))
        for i, (req, r) in items.items()
    }
    auto = [i for i, (req, _) in items.items() if isinstance(req.policy, AutoPolicy)]
    plans: dict[int, Plan] = {}
    if auto and (len(auto) > 1 or extra_rows):
        try:
            joint = plan_batch([items[i][0].policy for i in auto], [states[i] for i in auto], extra_rows)
            plans = dict(zip(auto, joint))
        except Exception as exc:  # a drafter proposing while the policies plan: plan each alone
            if type(exc) not in _joint_plan_failures:
                _joint_plan_failures.add(type(exc))
                log.warning("joint plan failed (%r); requests plan alone", exc, exc_info=exc)
            plans = {}
    alone = {i: states[i] for i in items if i not in plans}
    plans.update(_each(out, alone, lambda i, state: items[i][0].policy.plan(state)))
    return {i: plans[i] for i in items if i in plans}  # in request order


def draft(req: RunningRequest, ready: Ready, plan: Plan, trees: bool) -> Draft | TreeDraft:
    """3. Draft: the planned drafter proposes (or the proposal the policy already made), cut to
    what fits and, under a grammar, to its valid prefix (the target would reject the rest with
    certainty). A tree stays a tree only when `trees`. Changes the drafter's own state."""
    proposal = plan.draft
    if proposal is None:
        use = plan.drafter is not None and plan.k > 0
        proposal = plan.drafter.propose(ready.context, plan.k, req.grammar) if use else Draft()
    proposal = _fit(proposal, ready.max_k, req.slot.target.capabilities.max_branches if trees else 1)
    if req.grammar is not None and len(proposal):
        proposal = proposal.truncated(req.grammar.valid_prefix(proposal.token_ids))
    return proposal


def forward(
    target: Backend, drafted: Sequence[tuple[RunningRequest, Drafted]], prefills: Sequence[Prefill]
) -> list[np.ndarray]:
    """4. Forward: one target pass over, per request, [uncached committed tail, d_1..d_k] with
    logits for its k+1 rows [last committed, d_1..d_k] (and, when it asks for logprobs, the
    rows before its forced tokens: [m+k+1, V]), plus the prefill chunks (no logits, or a row
    each for prompt logprobs). A tree (a request alone) is one pass over all its branches.
    Changes the target caches: they now hold every row fed (commit truncates what is rejected).
    Returns the drafted requests' logits, then the prefill chunks'."""
    if len(drafted) == 1 and not prefills and isinstance(drafted[0][1].draft, TreeDraft):
        req, d = drafted[0]
        return [req.slot.target.extend_tree(d.ready.context[-1], d.draft.branches)]
    items = [
        (
            req.slot.target,
            [*d.ready.context[req.slot.target.num_cached :], *d.draft.token_ids],
            len(d.draft) + 1 + (len(d.ready.forced) if req.sampling.logprobs is not None else 0),
        )
        for req, d in drafted
    ]
    items += [(item[0], list(item[1]), len(item[1]) if _scored(item) else 0) for item in prefills]
    return extend_batch(target, items)


def score_prompts(prefills: Sequence[Prefill], logits: Sequence[np.ndarray]) -> dict[int, Exception]:
    """4b. Prompt logprobs (echo): a chunk's rows score the prompt tokens after its own ones.
    Changes req.prompt_logprobs (one entry per prompt token after the first). Returns the
    errors by prefill index: a prompt that cannot be scored ends its own request alone."""
    errors: dict[int, Exception] = {}
    for j, (item, rows) in enumerate(zip(prefills, logits)):
        if _scored(item):
            req = item[2]
            try:
                start = len(req.prompt_logprobs) + 1  # the first prompt token has no logprob
                following = req.prompt_ids[start : start + len(item[1])]
                req.prompt_logprobs.extend(logprobs(rows, following, req.sampling.prompt_logprobs))
            except Exception as exc:
                errors[j] = exc
    return errors


def verify(req: RunningRequest, drafted: Drafted, logits: np.ndarray) -> Verified:
    """5. Verify: accept a prefix of the draft and pick the next token from the target's rows
    (logits [k+1, V]), masked by the grammar at each row's position. Greedy: argmax; sampling:
    exact rejection sampling. Reads the grammar (it does not move) and draws from req.rng."""
    proposal, sampling = drafted.draft, req.sampling
    history = History(drafted.ready.context, len(req.prompt_ids))
    if isinstance(proposal, TreeDraft):
        branch, verdict = greedy_verify_tree(
            proposal.branches,
            [choose_greedy(x, sampling, replace(history, extra=b)) for x, b in zip(logits, proposal.branches)],
        )
        return Verified(
            drafted,
            verdict,
            proposal.branches[branch],
            branch,
            _logprobs(req, (), logits[branch], verdict.committed(proposal.branches[branch])),
        )
    history = replace(history, extra=proposal.token_ids)
    forced_rows, logits = logits[: len(logits) - len(proposal) - 1], logits[len(logits) - len(proposal) - 1 :]
    raw = logits  # [k+1, V]
    if req.grammar is not None:
        logits = masked(logits, req.grammar.masks(proposal.token_ids))  # [k+1, V]
    if req.greedy:
        verdict = greedy_verify(proposal.token_ids, choose_greedy(logits, sampling, history))
    else:
        verdict = rejection_sample(proposal, LazyTargetProbs(logits, sampling, history), req.rng)
    committed = verdict.committed(proposal.token_ids)
    return Verified(
        drafted,
        verdict,
        proposal.token_ids,
        logprobs=_logprobs(req, forced_rows, raw, drafted.ready.forced + tuple(committed)),
    )


def commit(req: RunningRequest, verified: Verified, fwd: Forward, batch_size: int) -> list[int]:
    """6. Commit: keep the accepted draft tokens in the target cache and drop the rejected rest;
    advance the grammar; record the step in the stats, the drafter and the policy, and where
    each token came from (req.pending_sources). Returns the forced + committed tokens (the
    request's push applies stop conditions)."""
    drafted, verdict = verified.drafted, verified.verdict
    proposal, forced = drafted.draft, list(drafted.ready.forced)
    if verified.branch is not None:
        req.slot.target.commit_branch(verified.branch, verdict.num_accepted)
    else:
        req.slot.target.truncate(len(drafted.ready.context) + verdict.num_accepted)
    committed = verdict.committed(verified.draft_ids)
    req.pending_logprobs.extend(verified.logprobs)
    accepted = (proposal.source,) * verdict.num_accepted
    req.pending_sources = ("grammar",) * len(forced) + accepted + ("target",)
    req.pending_step = (len(verified.draft_ids), verdict.num_accepted)
    if req.grammar is not None:
        req.grammar.consume([t for t in committed if t not in req.grammar.eos_token_ids])
    stats = StepStats(
        drafter=proposal.source if len(proposal) else "none",
        num_drafted=len(proposal),
        num_accepted=verdict.num_accepted,
        num_committed=len(committed) + len(forced),
        draft_ms=drafted.draft_ms,
        verify_ms=fwd.ms,
        planned_k=drafted.plan.k,
        num_branches=len(proposal.branches) if isinstance(proposal, TreeDraft) else 1,
        num_forced=len(forced),
        batch_rows=fwd.rows if fwd.batched else 0,
        batch_size=batch_size if fwd.batched else 1,
    )
    req.stats.record(stats)
    if drafted.plan.drafter is not None and len(proposal):
        drafted.plan.drafter.accept(verdict.num_accepted)
    req.policy.observe(stats)
    return forced + committed


# ---------------------------------------------------------------------- helpers
def _logprobs(req: RunningRequest, forced_rows: np.ndarray, rows: np.ndarray, tokens: Sequence[int]) -> tuple:
    """The logprobs of a step's forced + committed tokens (each from the row before it), when
    the request asks for them: forced_rows [m, V] then rows [k+1, V]."""
    if req.sampling.logprobs is None:
        return ()
    both = np.concatenate([forced_rows, rows[: len(tokens) - len(forced_rows)]]) if len(forced_rows) else rows
    return tuple(logprobs(both, tokens, req.sampling.logprobs))


def _scored(item: Prefill) -> bool:
    """Whether a prefill chunk's rows score its request's prompt (echo with logprobs)."""
    return len(item) > 2 and item[2] is not None and item[2].sampling.prompt_logprobs is not None


def _rows(req: RunningRequest, drafted: Drafted) -> int:
    """Target rows a request puts in the forward."""
    if isinstance(drafted.draft, TreeDraft):
        return 1 + len(drafted.draft)
    return len(drafted.ready.context) - req.slot.target.num_cached + len(drafted.draft)


def _fit(draft: Draft | TreeDraft, max_k: int, max_branches: int) -> Draft | TreeDraft:
    """Trim a proposal to max_k tokens per branch and to the branches the target can hold;
    a single branch becomes a chain (trees are greedy-only; sampling keeps exact chain
    verification, so a tree under sampling is reduced to its first branch)."""
    if isinstance(draft, TreeDraft):
        branches = tuple(b[:max_k] for b in draft.branches if max_k > 0 and len(b))[:max_branches]
        if len(branches) > 1:
            return TreeDraft(branches, draft.source, draft.score)
        return Draft(branches[0] if branches else (), None, draft.source, draft.score)  # trees have no kind
    return draft.truncated(max_k)
