"""Greedy equivalence on the exact toy backend: speculative output == plain output, for
every drafter x k in {1, 2, 5}, with a draft equal to the target (everything accepted)
and an unrelated draft (everything rejected), and for every policy.
"""

import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.calibrate import CostCurve
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.engine import Engine
from draftwise.policy.auto import AutoPolicy
from draftwise.types import SamplingParams, SpeculationConfig

TARGET = ToyModel(vocab_size=24, order=2, seed=1, sharpness=3.0)
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7, 8, 9, 5, 6, 7, 8], [10]]


def unrelated_logits(context):
    import numpy as np

    row = np.full(24, -10.0)
    row[(TARGET.logits(context).argmax() + 1) % 24] = 10.0  # never the target's choice
    return row


def make_drafters():
    return {
        "same": ModelDrafter(ToyBackend(TARGET, name="same"), name="same"),
        "related": ModelDrafter(ToyBackend(ToyModel(vocab_size=24, order=1, seed=1, sharpness=3.0)), name="related"),
        "unrelated": ModelDrafter(ToyBackend(logits_fn=unrelated_logits, vocab_size=24, name="u"), name="unrelated"),
        "ngram": NgramDrafter(1, 3),
    }


def plain(engine, prompt, n=60):
    return engine.generate(
        prompt_ids=prompt, sampling=SamplingParams(max_tokens=n), speculation=SpeculationConfig(enabled=False)
    ).token_ids


@pytest.mark.parametrize("drafter", ["same", "related", "unrelated", "ngram"])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_greedy_equivalence(drafter, k):
    engine = Engine(ToyBackend(TARGET), list(make_drafters().values()))
    for prompt in PROMPTS:
        expected = plain(engine, prompt)
        result = engine.generate(
            prompt_ids=prompt,
            sampling=SamplingParams(max_tokens=60),
            speculation=SpeculationConfig(policy="fixed", max_draft_tokens=k),
            drafters=[drafter],
        )
        assert result.token_ids == expected
        stats = result.stats
        if drafter == "same":
            assert stats.acceptance_rate == 1.0
            assert stats.tokens_per_step > 1.0
        if drafter == "unrelated":
            assert stats.num_drafted > 0 and stats.num_accepted == 0
            assert stats.tokens_per_step == 1.0


@pytest.mark.parametrize("policy", ["heuristic", "auto"])
def test_greedy_equivalence_adaptive_policies(policy):
    drafters = make_drafters()
    auto = AutoPolicy(
        target_cost=CostCurve.linear(10.0, 1.0), draft_costs={name: CostCurve.linear(0.5, 0.5) for name in drafters}
    )
    engine = Engine(ToyBackend(TARGET), list(drafters.values()), policy=auto if policy == "auto" else None)
    for prompt in PROMPTS:
        expected = plain(engine, prompt)
        result = engine.generate(
            prompt_ids=prompt,
            sampling=SamplingParams(max_tokens=60),
            speculation=SpeculationConfig(policy=policy, max_draft_tokens=4),
        )
        assert result.token_ids == expected


def test_draft_equal_to_target_accepts_everything_with_bonus():
    engine = Engine(ToyBackend(TARGET), [ModelDrafter(ToyBackend(TARGET), name="draft")])
    result = engine.generate(
        prompt_ids=[1, 2],
        sampling=SamplingParams(max_tokens=30, ignore_eos=True),
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=5),
    )
    # 30 tokens in steps of 6 (5 accepted + 1 bonus): exactly 5 target forwards.
    assert result.stats.num_steps == 5
    assert result.stats.accepted_per_position == [1.0] * 5
