"""Policies: each step, which drafter proposes and how many tokens (k = 0: none).

base.py holds the seam (Policy, PlanState, Plan); simple.py `fixed` and `heuristic`;
auto.py the cost-model policy (estimates.py, cost.py) and the batch planner. make_policy,
which names every implementation, sits here above them.
"""

from draftwise.policy.auto import AutoPolicy, plan_batch
from draftwise.policy.base import Plan, PlanState, Policy
from draftwise.policy.simple import FixedPolicy, HeuristicPolicy

__all__ = ["AutoPolicy", "FixedPolicy", "HeuristicPolicy", "Plan", "PlanState", "Policy", "make_policy", "plan_batch"]


def make_policy(name: str, **kwargs) -> Policy:
    if name == "fixed":
        return FixedPolicy()
    if name == "heuristic":
        return HeuristicPolicy(**kwargs)
    if name == "auto":
        return AutoPolicy(**kwargs)
    raise ValueError(f"unknown policy {name!r}; choose fixed, heuristic or auto")
