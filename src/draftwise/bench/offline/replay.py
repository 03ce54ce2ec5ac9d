"""Replay a bench run's baseline answers through the auto policy and free drafters, without the model.

Greedy decoding commits the target's argmax, so the baseline's answer is what a
speculative run commits too (up to llama.cpp's batched near-tie flips, docs/design.md
section 7). Replaying it step by step with the real AutoPolicy and drafters, and the
run's calibrated cost curve in place of the target's timings, shows what each drafter
set would have drafted, got accepted and cost: the same decisions on every run, no
timing noise, seconds instead of a half-hour bench. History drafters (suffix) keep
their state across prompts in suite order, as in the bench. On this machine the
replay's speedups land within a few points of the measured ones (docs/bench/README.md).

A step that verifies d draft tokens costs curve(d + 1) at its context length (the curve's
growth with context, where the calibration measured it); a plain step curve(1). Lookup
time is measured and added unless `count_lookups=False`, which also stops the policy
backing off from costly lookups (that reacts to measured time): fully deterministic.
`noise` multiplies each step's time by a log-normal factor, as on a shared machine, to
see how the policy's choices suffer from noisy timings.

The oracle is what the same drafters could reach with hindsight: at every position of the
answer each drafter proposes (up to max_k tokens), the longest correct proposal is known,
and the cheapest schedule of plain steps and verified prefixes of those proposals over the
whole answer is found by dynamic programming. The policy's speedup over the oracle's is the
share of the reachable gain it takes; the gap is what better planning could still win.
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from draftwise.backends.base import common_prefix_length, encode_chat
from draftwise.bench.suites.fim import fim_ids
from draftwise.bench.suites.prompts import Prompt
from draftwise.calibrate import CostCurve
from draftwise.drafters.base import Drafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.policy import PlanState
from draftwise.policy.auto import LOOKUP_SHARE, MAX_K, AutoPolicy
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig, StepStats


@dataclass(frozen=True)
class Step:
    """One target forward of a replayed schedule: it starts at answer position `pos`, verifies
    `drafted` tokens of `drafter`'s proposal, of which `accepted` are right, and commits
    accepted + 1 tokens in `ms`."""

    pos: int
    drafter: str
    drafted: int
    accepted: int
    ms: float


@dataclass(frozen=True)
class Positions:
    """Per answer position p: the longest correct proposal of any drafter at p (`correct`), the
    drafter that made it ('' when none was right), and whether p starts a line."""

    correct: tuple[int, ...]
    best: tuple[str, ...]
    line_start: tuple[bool, ...]


@dataclass(frozen=True)
class ReplayRun:
    """One answer replayed with one drafter set."""

    category: str
    question_id: int
    turn: int
    drafters: str
    num_tokens: int
    num_steps: int
    ms: float  # modelled decode time
    plain_ms: float  # the same answer decoded plainly
    oracle_ms: float = 0.0  # the cheapest schedule of this set's proposals, in hindsight
    # With `detail`: the policy's steps and the oracle's, and per answer position what the drafters
    # could get right (Positions), for gaps() to say where the oracle's extra speed comes from.
    steps: tuple[Step, ...] = ()
    oracle_steps: tuple[Step, ...] = ()
    positions: Positions | None = None

    @property
    def speedup(self) -> float:
        return self.plain_ms / self.ms

    @property
    def oracle_speedup(self) -> float:
        return self.plain_ms / self.oracle_ms if self.oracle_ms else 0.0


def baseline_answers(results: dict) -> dict[tuple[int, int], str]:
    """(question_id, turn) -> the greedy baseline's text, from a bench results.json."""
    out = {}
    for r in results.get("records", []):
        if (
            r.get("method") == "baseline"
            and not r.get("error")
            and r.get("temperature", 0) == 0
            and r.get("context_tokens") is None
        ):
            out[(r["question_id"], r["turn"])] = r["text"]
    if not out:
        raise ConfigError("the results hold no greedy baseline answers to replay (run the bench with 'baseline')")
    return out


def reference_answers(prompts: Sequence[Prompt]) -> dict[tuple[int, int], str]:
    """(question_id, 0) -> the prompt's reference answer, for one-turn prompts whose reference is
    a string (what an edit, a quote or a filled middle should be: `draftwise corpus` writes them)."""
    out = {(p.question_id, 0): p.reference for p in prompts if isinstance(p.reference, str) and p.reference}
    if not out:
        raise ConfigError("the prompts hold no reference answers to replay (a string 'reference' per prompt)")
    return out


def calibrated_curve(results: dict) -> CostCurve:
    """The target's cost curve from a bench results.json, or a calibration cache file's."""
    if "points" in results:
        return CostCurve.from_dict(results)
    curve = CostCurve.from_meta(results.get("meta", {}))
    if curve is None:
        raise ConfigError("the results hold no calibrated cost curve (run the bench with an auto method)")
    return curve


def replay(
    prompts: Sequence[Prompt],
    answers: Mapping[tuple[int, int], str],
    tokenizer,
    drafter_sets: Mapping[str, Sequence[Drafter]],
    curve: CostCurve,
    *,
    count_lookups: bool = True,
    noise: float = 0.0,
    seed: int = 0,
    max_k: int = MAX_K,
    oracle: bool = False,
    detail: bool = False,
    line_ends: frozenset[int] = frozenset(),
    fences: frozenset[int] = frozenset(),
    prices: CostCurve | None = None,
) -> list[ReplayRun]:
    """Replay every answered turn of `prompts` with each drafter set under its own AutoPolicy
    (drafting up to max_k tokens); with `oracle`, also each set's hindsight optimum; with
    `detail` (implies oracle), both schedules step by step (for gaps()). `line_ends`, the tokens
    that end a line, and `fences`, code fences (backends.base.text_marks), tell the policy where
    lines start and code blocks end, as live (without line_ends, gaps() finds line starts from
    the answers' own tokens). The policies believe `curve`; every forward, plain decoding's and
    the optimum's too, costs what `prices` says (default: the curve), and the policies learn
    the difference as they observe their steps, as live (bench.offline.account.run_prices: a run's own).

    Example: an answer that copies a code block from its prompt replays at over one token
    per step with {"ngram": [NgramDrafter()]} and exactly one with a set that never matches.
    """
    share = LOOKUP_SHARE if count_lookups else math.inf
    policies = {
        name: AutoPolicy(
            target_cost=curve,
            calibrate=False,
            lookup_share=share,
            max_k=max_k,
            line_ends=line_ends,
            fences=fences,
        )
        for name in drafter_sets
    }
    oracle = oracle or detail
    truth = prices or curve
    rng = random.Random(seed)
    runs: list[ReplayRun] = []
    for prompt in prompts:
        history: list[dict] = []
        for turn, text in enumerate(prompt.turns):
            answer = answers.get((prompt.question_id, turn))
            if answer is None:
                break
            messages = [*history, {"role": "user", "content": text}]
            prompt_ids = fim_ids(tokenizer, prompt) if prompt.suffix is not None else encode_chat(tokenizer, messages)
            answer_ids = tokenizer.encode(answer, add_special=False)
            history = [*messages, {"role": "assistant", "content": answer}]
            if not answer_ids:  # ended at once (EOS first): nothing to draft, no speedup to measure
                continue
            predicted = prompt.prediction_for(turn)
            speculation = SpeculationConfig(
                prediction=tokenizer.encode(predicted, add_special=False) if predicted else ()
            )
            newlines = frozenset()
            if detail:
                newlines = line_ends or newline_tokens(tokenizer, [*prompt_ids[-1:], *answer_ids])
            for name, drafters in drafter_sets.items():
                best: Schedule | None = None
                if oracle:
                    saved = [d.snapshot() if isinstance(d, SuffixDrafter) else None for d in drafters]
                    best = oracle_schedule(
                        drafters, speculation, prompt_ids, answer_ids, truth, max_k, newlines, tokenizer
                    )
                    for d, state in zip(drafters, saved):
                        if state is not None:
                            d.restore(state)
                steps = _replay_one(
                    policies[name],
                    drafters,
                    speculation,
                    prompt_ids,
                    answer_ids,
                    truth,
                    count_lookups,
                    noise,
                    rng,
                    tokenizer,
                )
                ms = sum(s.ms for s in steps)
                runs.append(
                    ReplayRun(
                        prompt.category,
                        prompt.question_id,
                        turn,
                        name,
                        len(answer_ids),
                        len(steps),
                        ms,
                        sum(truth.ms(1, len(prompt_ids) + pos) for pos in range(len(answer_ids))),
                        best.ms if best else 0.0,
                        tuple(steps) if detail else (),
                        best.steps if detail and best else (),
                        best.positions if detail and best else None,
                    )
                )
    return runs


@dataclass(frozen=True)
class Schedule:
    """The hindsight optimum of one answer: its modelled time, its steps, and the positions."""

    ms: float
    steps: tuple[Step, ...]
    positions: Positions


def oracle_ms(
    drafters: Sequence[Drafter],
    speculation: SpeculationConfig,
    prompt_ids: list[int],
    answer_ids: list[int],
    curve: CostCurve,
    max_k: int,
) -> float:
    """The least modelled time in which these drafters' proposals could have produced the answer
    (oracle_schedule's). Example: an answer its one drafter always proposes in full costs
    curve(len(answer)) at max_k >= len(answer) - 1."""
    return oracle_schedule(drafters, speculation, prompt_ids, answer_ids, curve, max_k).ms


def oracle_schedule(
    drafters: Sequence[Drafter],
    speculation: SpeculationConfig,
    prompt_ids: list[int],
    answer_ids: list[int],
    curve: CostCurve,
    max_k: int,
    newlines: frozenset[int] = frozenset(),
    tokenizer=None,
) -> Schedule:
    """The cheapest schedule of plain steps and verified prefixes of these drafters' proposals.

    correct[p] = the longest correct proposal of any drafter at position p (each proposes once
    per position, as the context grows one token at a time); then best[p] = min(curve(1) +
    best[p + 1], min over 1 <= k <= correct[p] of curve(k + 1) + best[p + k + 1]), each forward
    priced at its position's context.
    """
    sampling = SamplingParams()
    for d in drafters:
        d.begin(sampling, speculation, prompt_ids, tokenizer)
    n = len(answer_ids)
    correct, source = [0] * n, [""] * n
    for pos in range(n):
        context = prompt_ids + answer_ids[:pos]
        limit = min(max_k, n - pos - 1)
        for d in drafters:
            if limit <= 0:
                break
            draft = d.propose(context, limit)
            right = common_prefix_length(draft.token_ids[:limit], answer_ids[pos:])
            if right > correct[pos]:
                correct[pos], source[pos] = right, d.name
    best, choice = cheapest_schedule(correct, len(prompt_ids), curve)
    steps, pos = [], 0
    while pos < n:
        k = choice[pos]
        steps.append(Step(pos, source[pos] if k else "none", k, k, best[pos] - best[pos + k + 1]))
        pos += k + 1
    previous = [prompt_ids[-1] if prompt_ids else -1, *answer_ids[:-1]]
    line_start = tuple(t in newlines for t in previous)
    return Schedule(best[0], tuple(steps), Positions(tuple(correct), tuple(source), line_start))


def cheapest_schedule(correct: Sequence[int], prompt_len: int, curve: CostCurve) -> tuple[list[float], list[int]]:
    """(best, choice): best[p] = the least time from answer position p to the end, choice[p] = the
    tokens drafted at p on that schedule, where correct[p] tokens of a proposal at p are right and a
    forward of n tokens at position p costs curve.ms(n, prompt_len + p). Example: correct [1, 0]
    on a curve where 2 tokens cost less than two plain steps -> choice [1, 0]."""
    n = len(correct)
    best, choice = [0.0] * (n + 1), [0] * n
    for pos in range(n - 1, -1, -1):
        context = prompt_len + pos
        costs = [curve.ms(k + 1, context) + best[pos + k + 1] for k in range(correct[pos] + 1)]
        choice[pos] = min(range(len(costs)), key=costs.__getitem__)
        best[pos] = costs[choice[pos]]
    return best, choice


def newline_tokens(tokenizer, ids: Sequence[int]) -> frozenset[int]:
    """The tokens among `ids` whose text ends a line."""
    return frozenset(t for t in set(ids) if tokenizer.decode([t]).endswith("\n"))


def _replay_one(
    policy: AutoPolicy,
    drafters: Sequence[Drafter],
    speculation: SpeculationConfig,
    prompt_ids: list[int],
    answer_ids: list[int],
    curve: CostCurve,
    count_lookups: bool,
    noise: float,
    rng: random.Random,
    tokenizer=None,
) -> list[Step]:
    """One answer under one policy, step by step."""
    policy.begin(drafters, speculation)
    for d in drafters:
        d.begin(SamplingParams(), speculation, prompt_ids, tokenizer)
    steps: list[Step] = []
    pos = 0
    while pos < len(answer_ids):
        context = prompt_ids + answer_ids[:pos]
        t0 = time.perf_counter()
        plan = policy.plan(PlanState(context=context, max_k=len(answer_ids) - pos - 1))
        draft = plan.draft
        if draft is None and plan.drafter is not None and plan.k > 0:
            draft = plan.drafter.propose(context, plan.k)
        lookup_ms = 1000 * (time.perf_counter() - t0) if count_lookups else 0.0
        proposal = draft.token_ids[: plan.k] if draft is not None else ()
        accepted = 0
        while accepted < len(proposal) and proposal[accepted] == answer_ids[pos + accepted]:
            accepted += 1
        verify_ms = curve.ms(len(proposal) + 1, len(context)) * (rng.lognormvariate(0.0, noise) if noise else 1.0)
        policy.observe(
            StepStats(
                drafter=plan.drafter.name if proposal else "none",
                num_drafted=len(proposal),
                num_accepted=accepted,
                num_committed=accepted + 1,
                draft_ms=lookup_ms,
                verify_ms=verify_ms,
                planned_k=plan.k,
            )
        )
        name = plan.drafter.name if proposal else "none"
        steps.append(Step(pos, name, len(proposal), accepted, lookup_ms + verify_ms))
        pos += accepted + 1
    return steps


def summarize(runs: Sequence[ReplayRun]) -> dict[str, dict[str, dict[str, float]]]:
    """category ("all" too) -> drafter set -> tokens_per_step (pooled) and speedup (geometric mean)."""
    groups: dict[tuple[str, str], list[ReplayRun]] = defaultdict(list)
    for run in runs:
        groups[(run.category, run.drafters)].append(run)
    for run in runs:  # "all" comes last
        groups[("all", run.drafters)].append(run)
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for (category, name), group in groups.items():
        out[category][name] = {
            "tokens_per_step": sum(r.num_tokens for r in group) / sum(r.num_steps for r in group),
            "speedup": _geomean(r.speedup for r in group),
            "turns": len(group),
        }
        if all(r.oracle_ms for r in group):
            out[category][name]["oracle_speedup"] = _geomean(r.oracle_speedup for r in group)
    return dict(out)


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


# Where in a copy a position lies, for gaps(): no drafter right there, the first position of a
# copied stretch (a `resume` when a long copy ended just before: an edit inside copied text), its
# first EARLY tokens, or deeper.
RESUME_WITHIN, LONG_COPY, EARLY = 8, 16, 16
PLACES = ("none", "start", "resume", "early", "deep")


def places(positions: Positions) -> list[str]:
    """Each answer position's place in the copies its drafters could make (PLACES).

    Example: correct = (0, 3, 2, 1, 0) -> none, start, early, early, none."""
    correct = positions.correct
    out: list[str] = []
    copy_start, last_end, last_length = -1, -(10**9), 0
    for p, right in enumerate(correct):
        covered = p > 0 and correct[p - 1] >= 2  # the proposal made one position earlier reaches p
        if covered:
            out.append("early" if p - copy_start < EARLY else "deep")
            continue
        if copy_start >= 0:  # the copy that reached p - 1 ended there
            last_end, last_length, copy_start = p - 1, p - copy_start, -1
        if right == 0:
            out.append("none")
            continue
        resumed = p - last_end <= RESUME_WITHIN and last_length >= LONG_COPY
        out.append("resume" if resumed else "start")
        copy_start = p
    return out


@dataclass
class Gap:
    """The policy's and the oracle's time on the positions of one place (and drafter)."""

    tokens: int = 0
    policy_ms: float = 0.0
    oracle_ms: float = 0.0
    policy_steps: int = 0  # steps that start here
    policy_drafted: int = 0
    policy_accepted: int = 0
    policy_plain: int = 0  # steps that start here and draft nothing
    oracle_steps: int = 0
    oracle_drafted: int = 0

    @property
    def gap_ms(self) -> float:
        return self.policy_ms - self.oracle_ms


def _per_position_ms(steps: Sequence[Step], n: int) -> list[float]:
    """Each step's time spread evenly over the tokens it commits."""
    out = [0.0] * n
    for s in steps:
        span = range(s.pos, min(n, s.pos + s.accepted + 1))
        for p in span:
            out[p] = s.ms / len(span)
    return out


def gaps(runs: Sequence[ReplayRun], by_line_start: bool = False) -> dict[tuple[str, str], Gap]:
    """(place, drafter that could copy there) -> Gap, over every run replayed with `detail`
    (with by_line_start, the place is suffixed '@line' at line starts). Where the hindsight
    optimum's extra speed comes from: the gap_ms of each place, and the steps both take there.
    """
    out: dict[tuple[str, str], Gap] = defaultdict(Gap)
    for run in runs:
        if run.positions is None:
            continue
        where = places(run.positions)
        n = len(where)
        policy_ms = _per_position_ms(run.steps, n)
        oracle_ms = _per_position_ms(run.oracle_steps, n)
        lines = run.positions.line_start if by_line_start else (False,) * n
        keys = [(where[p] + ("@line" if lines[p] else ""), run.positions.best[p] or "-") for p in range(n)]
        for p in range(n):
            g = out[keys[p]]
            g.tokens += 1
            g.policy_ms += policy_ms[p]
            g.oracle_ms += oracle_ms[p]
        for s in run.steps:
            g = out[keys[s.pos]]
            g.policy_steps += 1
            g.policy_drafted += s.drafted
            g.policy_accepted += s.accepted
            g.policy_plain += s.drafted == 0
        for s in run.oracle_steps:
            g = out[keys[s.pos]]
            g.oracle_steps += 1
            g.oracle_drafted += s.drafted
    return dict(out)
