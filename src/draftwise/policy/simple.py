"""The two simple policies: `fixed` (always k = max_draft_tokens with the first drafter) and
`heuristic` (k moved by the last step's acceptance: x1.2 above 0.9, x0.8 below 0.7, within
[k_min, k_max]). Neither knows what a step costs; `auto` (auto.py) does. A request that carries a
prediction drafts from it (the prediction drafter, wherever it is in the list): it is the text
the caller said the answer copies.
"""

from __future__ import annotations

from collections.abc import Sequence

from draftwise.drafters.base import Drafter
from draftwise.policy.base import Plan, PlanState
from draftwise.types import SpeculationConfig, StepStats


def one_drafter(drafters: Sequence[Drafter], speculation: SpeculationConfig) -> Drafter | None:
    """The drafter a simple policy drafts with: the prediction's when the request has one, else the first."""
    if not drafters or not speculation.enabled:
        return None
    if speculation.prediction:
        return next((d for d in drafters if d.name == "prediction"), drafters[0])
    return drafters[0]


class FixedPolicy:
    name = "fixed"

    def __init__(self) -> None:
        self._drafter: Drafter | None = None
        self._k = 0
        self._branches = 1

    def begin(self, drafters: Sequence[Drafter], speculation: SpeculationConfig) -> None:
        self._drafter = one_drafter(drafters, speculation)
        self._k = speculation.max_draft_tokens
        self._branches = speculation.max_branches

    def plan(self, state: PlanState) -> Plan:
        if self._drafter is None:
            return Plan(None, 0)
        k = min(self._k, state.max_k)
        tree = None
        if self._branches > 1 and state.greedy and k > 0:
            tree = self._drafter.propose_tree(state.context, k, self._branches)
        return Plan(self._drafter, k, tree)

    def observe(self, step: StepStats) -> None:
        pass

    def snapshot(self) -> dict:
        return {"policy": self.name, "k": self._k}


class HeuristicPolicy:
    """Acceptance-rate rule on a real-valued k, rounded when planning."""

    name = "heuristic"
    RAISE_ABOVE, LOWER_BELOW = 0.9, 0.7
    RAISE_BY, LOWER_BY = 1.2, 0.8

    def __init__(self, k_max: int = 16) -> None:
        self.k_max = k_max
        self._drafter: Drafter | None = None
        self._k = 4.0
        self._k_min = 1

    def begin(self, drafters: Sequence[Drafter], speculation: SpeculationConfig) -> None:
        self._drafter = one_drafter(drafters, speculation)
        self._k = float(speculation.max_draft_tokens)
        self._k_min = speculation.min_draft_tokens
        self.k_max = max(self.k_max, speculation.max_draft_tokens)

    def plan(self, state: PlanState) -> Plan:
        if self._drafter is None:
            return Plan(None, 0)
        return Plan(self._drafter, min(round(self._k), state.max_k))

    def observe(self, step: StepStats) -> None:
        if not step.num_drafted:
            return
        rate = step.num_accepted / step.num_drafted
        if rate > self.RAISE_ABOVE:
            # NOTE: ceil-like step so that k=1 can grow (1 * 1.2 rounds back to 1).
            self._k = max(self._k * self.RAISE_BY, round(self._k) + 1)
        elif rate < self.LOWER_BELOW:
            self._k *= self.LOWER_BY
        self._k = min(max(self._k, self._k_min), self.k_max)

    def snapshot(self) -> dict:
        return {"policy": self.name, "k": self._k}
