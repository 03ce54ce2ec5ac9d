"""The Policy seam: what a policy sees each step (PlanState) and what it decides (Plan).

A policy decides, each step, which drafter proposes and how many tokens (k = 0: none),
and learns from what the step did (StepStats). Implementations: simple.py (fixed,
heuristic) and auto.py (the cost model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from draftwise.drafters.base import Drafter
from draftwise.types import Draft, SpeculationConfig, StepStats, TreeDraft

if TYPE_CHECKING:
    from draftwise.constraints import Grammar


@dataclass(frozen=True)
class PlanState:
    context: Sequence[int]  # committed tokens (prompt + generated)
    max_k: int  # the most draft tokens that fit (context window, max_tokens)
    greedy: bool = True  # token trees are verified greedily only
    grammar: Grammar | None = None  # the request's constraint at `context` (structured output)
    num_forced: int = 0  # grammar-forced tokens at the end of context, fed in this step's forward


@dataclass(frozen=True)
class Plan:
    drafter: Drafter | None
    k: int
    draft: Draft | TreeDraft | None = None  # a proposal the policy already obtained while planning


class Policy(Protocol):
    name: str

    def begin(self, drafters: Sequence[Drafter], speculation: SpeculationConfig) -> None: ...
    def plan(self, state: PlanState) -> Plan: ...
    def observe(self, step: StepStats) -> None: ...
    def snapshot(self) -> dict: ...
