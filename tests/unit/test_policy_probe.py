"""A draft model's acceptance is learnt, not held to its prior (issue 58, part 3): the auto policy
probes a draft model it would not draft with (policy.auto.PROBE_*), learns from the probe, and
drafts with it where it pays; a draft that keeps missing costs one short probe per PROBE_AFTER
steps."""

import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.calibrate import CostCurve
from draftwise.drafters import ModelDrafter
from draftwise.policy import PlanState
from draftwise.policy.auto import PROBE_AFTER, PROBE_K, AutoPolicy
from draftwise.policy.estimates import AcceptanceEstimate
from draftwise.types import SpeculationConfig, StepStats

# A plain step 30 ms, each more row 12 ms, a draft token 5 ms: at the 0.70 prior the best draft
# is 1.09x plain (k = 1), under the 1.10x the policy asks for, so it would never draft; a draft
# accepted 96% of the time runs 1.4x at k = 4.
TARGET = CostCurve.linear(30.0, 12.0)
DRAFT = CostCurve.linear(5.0, 5.0)


def policy_and_drafter(prior=None):
    drafter = ModelDrafter(ToyBackend(ToyModel(vocab_size=8)), name="draft")
    if prior is not None:
        drafter.acceptance_prior = prior
    drafter.catch_up = lambda context: 1  # no proposal runs here: its cache is taken as in step
    policy = AutoPolicy(target_cost=TARGET, draft_costs={"draft": DRAFT})
    policy.begin([drafter], SpeculationConfig())
    return policy, drafter


def run(policy, steps, accepted):
    """Plan and observe `steps` steps whose drafted tokens are accepted by accepted(k); the plans."""
    plans = []
    for _ in range(steps):
        plan = policy.plan(PlanState(context=[1, 2, 3], max_k=16))
        plans.append((plan.k, policy.last_decision["probe"]))
        a = accepted(plan.k) if plan.k else 0
        verify = TARGET.ms(plan.k + 1)
        policy.observe(
            StepStats(
                drafter="draft" if plan.k else "none",
                num_drafted=plan.k,
                num_accepted=a,
                num_committed=a + 1,
                draft_ms=DRAFT.ms(1) * plan.k,
                verify_ms=verify,
                planned_k=plan.k,
            )
        )
    return plans


def test_the_prior_alone_would_never_draft():
    policy, _ = policy_and_drafter()
    policy._since_drafted["draft"] = 0  # as if it had just drafted: no probe due
    assert policy.plan(PlanState(context=[1, 2, 3], max_k=16)).k == 0


def test_a_draft_model_the_prior_prices_below_plain_is_probed_and_then_drafted_where_it_pays():
    policy, drafter = policy_and_drafter()
    plans = run(policy, 40, accepted=lambda k: k)  # every drafted token accepted
    first_k, first_probe = plans[0]
    assert first_probe and 1 <= first_k <= PROBE_K  # a request starts with a probe
    later = plans[10:]
    assert all(k > 0 and not probe for k, probe in later)  # learnt: it drafts at every step
    assert max(k for k, _ in later) >= 4
    assert policy.snapshot()["acceptance"]["draft"][0] > 0.9


def test_a_draft_model_that_keeps_missing_is_probed_ever_less_often():
    policy, _ = policy_and_drafter()
    plans = run(policy, 8 * PROBE_AFTER, accepted=lambda k: 0)
    at = [i for i, (k, probe) in enumerate(plans) if k]
    assert all(plans[i][1] and plans[i][0] <= PROBE_K for i in at)
    # Each miss doubles the wait: probes at 0, then after 64 and 128 more steps (not every 32).
    assert len(at) == 3 and at[1] - at[0] > 2 * PROBE_AFTER - 2 and at[2] - at[1] > 4 * PROBE_AFTER - 2
    # The probes' verdicts are learnt: its first position's estimate fell from the prior.
    assert policy.snapshot()["acceptance"]["draft"][0] < 0.5


def test_each_request_starts_with_a_probe():
    policy, drafter = policy_and_drafter()
    run(policy, 3 * PROBE_AFTER // 2, accepted=lambda k: 0)
    policy.begin([drafter], SpeculationConfig())
    assert run(policy, 1, accepted=lambda k: 0)[0][1]


def test_a_drafter_declares_its_prior_per_position():
    policy, _ = policy_and_drafter(prior=(0.6, 0.5))
    policy._since_drafted["draft"] = 0
    policy.plan(PlanState(context=[1, 2, 3], max_k=16))
    assert policy.snapshot()["acceptance"]["draft"][:3] == [0.6, 0.5, 0.5]


def test_a_position_drafted_a_few_times_is_shrunk_toward_the_one_before_not_the_prior():
    est = AcceptanceEstimate(prior=0.7)
    for _ in range(10):
        est.update(2, 2)  # positions 0 and 1: every token accepted
    est.update(3, 3)  # position 2 once
    assert est.rate(2) > 0.9


def test_an_estimate_with_a_prior_per_position_borrows_its_shape_beyond_what_it_saw():
    est = AcceptanceEstimate(prior=(0.8, 0.4))
    assert est.rate(0) == 0.8 and est.rate(5) == pytest.approx(0.4)
    for _ in range(30):
        est.update(1, 1)  # only the first position drafted, always accepted
    assert est.rate(0) > 0.95
    assert est.rate(1) == pytest.approx(est.rate(0) * 0.4 / 0.8)


def test_a_draft_model_slower_than_its_curve_is_priced_at_what_its_drafts_take():
    """Drafts taking 3x what the draft's curve says (a string-level draft writes more tokens of
    its own than it proposes; Python around each forward): the draft's time scale follows, and
    the draft stops paying."""
    policy, _ = policy_and_drafter()
    for _ in range(60):
        plan = policy.plan(PlanState(context=[1, 2, 3], max_k=16))
        k = plan.k
        policy.observe(
            StepStats(
                drafter="draft" if k else "none",
                num_drafted=k,
                num_accepted=k,
                num_committed=k + 1,
                draft_ms=3 * DRAFT.ms(1) * k,
                verify_ms=TARGET.ms(k + 1),
                planned_k=k,
            )
        )
    assert policy.snapshot()["draft_time_scale"]["draft"] > 2.0


def test_a_later_probe_pays_its_catch_up():
    """The request's first probe spreads its catch-up over PROBE_AFTER steps; a later one prices the
    text it must catch up on whole: where that costs more than the probe could win, there is none."""
    policy, drafter = policy_and_drafter()
    drafter.catch_up = lambda context: 64 if policy._probed else 2  # later 64 behind: 320 ms
    plans = run(policy, 4 * PROBE_AFTER, accepted=lambda k: 0)
    assert [i for i, (k, _) in enumerate(plans) if k] == [0]


def test_a_draft_known_to_miss_is_not_probed_at_the_optimistic_price():
    """Once a draft's first position has PROBE_EVIDENCE drafts behind it, a probe is priced at its
    estimate plus PROBE_BONUS: one accepted half the time is no longer probed in each request."""
    from draftwise.policy.auto import PROBE_EVIDENCE

    policy, drafter = policy_and_drafter()
    est = policy._estimate("draft", 0.7)
    for i in range(12):
        est.update(2, i % 2)  # its first token accepted half the time, the second never
    assert est.trials[0] >= PROBE_EVIDENCE and est.rate(0) < 0.6
    policy.begin([drafter], SpeculationConfig())  # a new request: a probe is due
    assert run(policy, 1, accepted=lambda k: 0)[0][0] == 0


def test_a_long_prompt_to_catch_up_on_is_spread_over_the_steps_it_informs():
    """An 8-token prompt on the draft (40 ms here) is priced at 1/PROBE_AFTER of that in the
    request's first probe: worth it on these costs, where a 320-token one (1.6 s) is not."""
    for behind, probed in ((8, True), (320, False)):
        policy, drafter = policy_and_drafter()
        drafter.catch_up = lambda context, behind=behind: behind
        assert bool(run(policy, 1, accepted=lambda k: k)[0][0]) == probed
