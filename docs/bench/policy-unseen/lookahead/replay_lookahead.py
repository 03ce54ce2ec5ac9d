"""Replay a corpus split's edits and copies (or a bench run's answers) with the policy choosing a
lookup's k by looking ahead, not by this step's rate alone. The variants:

- "base": the policy as it is: of every (drafter, k), the best expected tokens per ms of this
  forward, E(k) / T(k + 1), against plain decoding's at MIN_GAIN.
- "dp": whether to draft and with which drafter as the policy decides; k then minimises the
  expected time to the end of the copy (the token where it breaks), the steps after this one
  included, by the same estimates: C(j) = min_k T(k + 1) + S(j, k) c(j + k) C(j + k + 1), where
  c(i) is the estimate that the copy's token i is right once the ones before it were, S(j, k)
  the chance that its tokens j..j+k-1 all are, and a break ends the copy (the target's own
  token, committed by the same forward, is the break). Past the proposal's last token c stays at
  its last value (the copy's stationary cost, min_k T(k + 1) / (1 - c^(k + 1)), closes it off).
- "dp_plain": as dp, and plain decoding too where the look-ahead prefers it (k = 0: one plain
  step, then the copy from one token further on).
- "told": not a policy but a bound: the policy's choices, each draft then cut in hindsight to the
  tokens the answer keeps (a draft whose first token is wrong becomes a plain step). What the
  policy would reach if it knew where the drafts it chose break, and nothing else.
- "unguarded": the policy without the guards that hold Spec-Bench's floor (MIN_GAIN 1.0 for
  1.10, START_DEBT 0 for 4): how much of a short answer's gap they cost.

    python docs/bench/policy-unseen/lookahead/replay_lookahead.py base,dp,dp_plain,told \
        corpus/dev.jsonl docs/bench/policy-unseen/zen4/curve.json
    python docs/bench/policy-unseen/lookahead/replay_lookahead.py base,told \
        dev-fim docs/bench/policy-unseen/zen4/curve.json

(the second: a bench run's own answers, priced at a calibration file's curve instead of the
run's forwards).

The variants wrap the policy's methods in this script; the policy has no such options.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

spec = importlib.util.spec_from_file_location("variants", Path(__file__).parents[1] / "zen4" / "replay_variants.py")
variants = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variants)
auto = variants.auto
ORIGINAL_CONCLUDE = auto.AutoPolicy.conclude
HORIZON = 256
MODE = {"dp": False, "plain": False, "told": False}
ANSWER: list = [0, ()]  # the replayed answer: (its prompt's length, its tokens)


def rates_of(expected) -> np.ndarray:
    """c(0..n-1) from E(0..n): S(k) = E(k) - E(k - 1) is the chance the first k tokens hold."""
    survive = np.diff(np.asarray(expected, dtype=float))
    prev = np.concatenate(([1.0], survive[:-1]))
    return np.clip(np.divide(survive, prev, out=np.zeros_like(survive), where=prev > 0), 1e-9, 1.0)


def lookahead_k(expected, forward_ms: np.ndarray, max_k: int) -> tuple[int, np.ndarray]:
    """(the k that minimises the expected time to the copy's end, Q(0, k) for k = 0..n)."""
    c = rates_of(expected)
    n = len(c)
    if n == 0:
        return 0, np.array([forward_ms[1]])
    last = c[-1]
    span = n + HORIZON
    c = np.concatenate((c, np.full(HORIZON + max_k + 2, last)))
    logc = np.concatenate(([0.0], np.cumsum(np.log(c))))
    ks = np.arange(0, max_k + 1)
    t = forward_ms[ks + 1]
    stationary = np.min(t / np.maximum(1e-12, 1.0 - last ** (ks + 1)))
    cost = np.full(span + max_k + 2, stationary)
    for j in range(span - 1, 0, -1):
        hold = np.exp(logc[j + ks] - logc[j]) * c[j + ks]
        cost[j] = np.min(t + hold * cost[j + ks + 1])
    ks0 = ks[: n + 1]
    q = forward_ms[ks0 + 1] + np.exp(logc[ks0]) * c[ks0] * cost[ks0 + 1]
    return int(np.argmin(q)), q


def conclude(self, menu, option, k, rows, rate):
    """The policy's choice of drafter (and whether to draft) as it is; a lookup's k by look-ahead."""
    if MODE["dp"] and option is not None and option.draft is not None:
        m = menu.num_forced
        forward = np.array([0.0] + [self.time.ms(m + n, self._context) for n in range(1, self.max_k + 3)])
        k_dp, _ = lookahead_k(option.expected, forward, self.max_k)
        if k_dp or MODE["plain"]:
            k = k_dp
        if k == 0:
            option = None
        rows = m + k + 1
    return ORIGINAL_CONCLUDE(self, menu, option, k, rows, rate)


MODES = {"base": (False, False, False), "dp": (True, False, False), "dp_plain": (True, True, False)}
MODES["told"] = (False, False, True)
MODES["unguarded"] = (False, False, False)
GUARDS = {"MIN_GAIN": auto.MIN_GAIN, "START_DEBT": auto.START_DEBT}
ORIGINAL_INSTALL = variants.install
ORIGINAL_ONE = variants.replay._replay_one
ORIGINAL_POLICY_PLAN = auto.AutoPolicy.plan


def install(name: str) -> None:
    MODE["dp"], MODE["plain"], MODE["told"] = MODES.get(name, (False, False, False))
    unguarded = name == "unguarded"
    auto.MIN_GAIN, auto.START_DEBT = (1.0, 0.0) if unguarded else (GUARDS["MIN_GAIN"], GUARDS["START_DEBT"])
    ORIGINAL_INSTALL(name if name in variants.VARIANTS else "base")


def replay_one(policy, drafters, speculation, prompt_ids, answer_ids, *args, **kwargs):
    ANSWER[:] = [len(prompt_ids), answer_ids]
    return ORIGINAL_ONE(policy, drafters, speculation, prompt_ids, answer_ids, *args, **kwargs)


def plan(self, state):
    out = ORIGINAL_POLICY_PLAN(self, state)
    if not MODE["told"] or out.draft is None or not out.k:
        return out
    start, answer = ANSWER
    pos = len(state.context) - start
    proposal = out.draft.token_ids[: out.k]
    kept = variants.common_prefix_length(proposal, answer[pos : pos + len(proposal)])
    if kept == len(proposal):
        return out
    return auto.Plan(out.drafter, kept, out.draft.truncated(kept)) if kept else auto.Plan(None, 0)


variants.replay._replay_one = replay_one
auto.AutoPolicy.plan = plan
auto.AutoPolicy.conclude = conclude
variants.install = install
variants.VARIANTS.update({name: {} for name in MODES})

if __name__ == "__main__":
    names, split, prices = sys.argv[1].split(","), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""
    if Path(split).is_dir() and prices:  # a bench run's answers, priced at a calibration file's curve
        curve = variants.replay.calibrated_curve(json.loads(Path(prices).read_text()))
        variants.replay.calibrated_curve = lambda data: curve
        variants.account.run_prices = lambda data, curve: None
    variants.main(names, split, prices)
