"""The prediction drafter: alignment, re-synchronisation after insertions, deletions and
changes (checked against difflib's alignment), empty and unrelated predictions, and greedy
equivalence with and without a prediction on the toy backend.
"""

import difflib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.drafters import NgramDrafter
from draftwise.drafters.prediction import PredictionDrafter
from draftwise.engine import Engine
from draftwise.types import SamplingParams, SpeculationConfig

PROMPT = [900, 901, 902]


def drafter_for(prediction):
    d = PredictionDrafter()
    d.begin(SamplingParams(), SpeculationConfig(prediction=prediction))
    return d


def test_follows_the_prediction_and_rejoins_after_an_insertion():
    d = drafter_for([5, 6, 7, 8, 9])
    assert d.propose(PROMPT, 3).token_ids == (5, 6, 7)
    assert d.propose(PROMPT + [5, 6], 3).token_ids == (7, 8, 9)
    assert d.propose(PROMPT + [5, 6, 4], 3).token_ids == ()  # off the prediction: nothing to say
    assert d.propose(PROMPT + [5, 6, 4, 7, 8], 3).token_ids == (9,)  # rejoined at (7, 8)
    assert d.propose(PROMPT + [5, 6, 4, 7, 8, 9], 3).token_ids == ()  # the prediction is used up


def test_a_deletion_skips_ahead_and_never_back():
    d = drafter_for([1, 2, 3, 4, 5, 6, 1, 2, 7])
    assert d.propose(PROMPT, 2).token_ids == (1, 2)
    # The answer drops 3, 4: (5, 6) re-anchors ahead; later (1, 2) matches the second occurrence only.
    assert d.propose(PROMPT + [1, 2, 5, 6], 2).token_ids == (1, 2)
    assert d.propose(PROMPT + [1, 2, 5, 6, 1, 2], 2).token_ids == (7,)


def test_empty_and_unrelated_predictions_propose_nothing():
    assert drafter_for([]).propose(PROMPT + [1, 2], 4).token_ids == ()
    d = drafter_for([50, 51, 52, 53])
    d.propose(PROMPT, 4)
    for i in range(1, 20):
        assert d.propose(PROMPT + list(range(100, 100 + i)), 4).token_ids == ()


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_resync_agrees_with_difflib(data):
    """Prediction tokens are distinct and inserted tokens come from another range, so the diff is
    unambiguous: wherever the last two answer tokens and the next one lie in one matching block
    of difflib's alignment, the proposal's first token is the next answer token; inside an
    insertion, nothing is proposed."""
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    prediction = rng.sample(range(1000), rng.randint(10, 60))
    answer, i = [], 0
    while i < len(prediction):
        op = rng.random()
        if op < 0.7:
            step = rng.randint(1, 8)
            answer += prediction[i : i + step]
            i += step
        elif op < 0.8:
            i += rng.randint(1, 5)  # deletion
        elif op < 0.9:
            answer += [rng.randint(2000, 3000) for _ in range(rng.randint(1, 4))]  # insertion
        else:
            i += rng.randint(1, 3)  # change
            answer += [rng.randint(2000, 3000) for _ in range(rng.randint(1, 3))]
    blocks = difflib.SequenceMatcher(None, prediction, answer, autojunk=False).get_matching_blocks()
    block_of = {}
    for b, (_, start, size) in enumerate(blocks):
        for j in range(start, start + size):
            block_of[j] = b
    d = drafter_for(prediction)
    for n in range(len(answer)):
        draft = d.propose(PROMPT + answer[:n], 4).token_ids
        if n >= 2 and block_of.get(n - 2) is not None and block_of.get(n - 2) == block_of.get(n - 1) == block_of.get(n):
            assert draft and draft[0] == answer[n], (n, answer[n - 2 : n + 1], draft)
        if n >= 1 and answer[n - 1] >= 2000:
            assert draft == (), (n, draft)


TARGET = ToyModel(vocab_size=24, order=2, seed=1, sharpness=3.0)


def plain(engine, prompt, n=60):
    return engine.generate(
        prompt_ids=prompt, sampling=SamplingParams(max_tokens=n), speculation=SpeculationConfig(enabled=False)
    ).token_ids


@pytest.mark.parametrize("policy", ["fixed", "auto"])
@pytest.mark.parametrize("k", [1, 4, 16])
def test_greedy_output_is_the_same_with_any_prediction(policy, k):
    from draftwise.calibrate import CostCurve
    from draftwise.policy.auto import AutoPolicy

    auto = AutoPolicy(target_cost=CostCurve.linear(10.0, 1.0)) if policy == "auto" else None
    engine = Engine(ToyBackend(TARGET), [PredictionDrafter(), NgramDrafter(1, 3)], policy=auto)
    prompt = [1, 2, 3]
    expected = plain(engine, prompt)
    edited = expected[:20] + [5, 5, 5] + expected[25:]
    for prediction in (expected, edited, [7] * 40, []):
        spec = SpeculationConfig(policy=policy, max_draft_tokens=k, prediction=prediction)
        result = engine.generate(
            prompt_ids=prompt,
            sampling=SamplingParams(max_tokens=60),
            speculation=spec,
            drafters=["prediction"] if policy == "fixed" else None,
        )
        assert result.token_ids == expected
        if prediction == expected:
            assert result.stats.accepted_by["prediction"] == result.stats.drafted_by["prediction"] > 0
            assert result.stats.tokens_per_step > 1.0


def test_engine_takes_the_prediction_as_text():
    engine = Engine(ToyBackend(ToyModel(vocab_size=40, sharpness=3)), [PredictionDrafter()])
    expected = engine.generate(
        "abc", sampling=SamplingParams(max_tokens=30), speculation=SpeculationConfig(enabled=False)
    )
    result = engine.generate(
        "abc",
        sampling=SamplingParams(max_tokens=30),
        prediction=expected.text,
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=8),
    )
    assert result.token_ids == expected.token_ids
    assert result.stats.num_accepted == result.stats.drafted_by["prediction"] > 0


@pytest.mark.parametrize("policy", ["fixed", "heuristic"])
def test_the_simple_policies_draft_from_a_prediction_wherever_its_drafter_is_listed(policy):
    engine = Engine(ToyBackend(TARGET), [NgramDrafter(1, 3), PredictionDrafter()])
    prompt = [1, 2, 3]
    expected = plain(engine, prompt)
    with_prediction = engine.generate(
        prompt_ids=prompt,
        sampling=SamplingParams(max_tokens=60),
        speculation=SpeculationConfig(policy=policy, max_draft_tokens=4, prediction=expected),
    )
    assert with_prediction.token_ids == expected
    assert set(with_prediction.stats.drafted_by) == {"prediction"}
    without = engine.generate(
        prompt_ids=prompt,
        sampling=SamplingParams(max_tokens=60),
        speculation=SpeculationConfig(policy=policy, max_draft_tokens=4),
    )
    assert set(without.stats.drafted_by) <= {"ngram"}  # the first drafter, as before
