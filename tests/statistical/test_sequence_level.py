"""Sequence level: 3-token continuations sampled with speculation follow the exact joint
distribution of the toy target (computed by enumeration), for a draft model at several
draft temperatures, for prompt lookup, and with top-k / top-p applied.
"""

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.engine import Engine
from draftwise.sampling import distribution
from draftwise.types import SamplingParams, SpeculationConfig

# slow: each check samples 12,000 sequences, enough for the chi-square test to see a 1% bias
pytestmark = pytest.mark.slow

VOCAB = 5
PROMPT = [1, 2, 1, 2, 1]
NUM_SAMPLES = 12_000
LENGTH = 3


def exact_joint(model: ToyModel, params: SamplingParams) -> dict[tuple[int, ...], float]:
    joint = {}
    for seq in itertools.product(range(VOCAB), repeat=LENGTH):
        prob, context = 1.0, list(PROMPT)
        for token in seq:
            prob *= distribution(model.logits(context)[None, :], params)[0, token]
            context.append(token)
        joint[seq] = prob
    return joint


def sample_joint(engine, params, speculation, drafters, num_samples=NUM_SAMPLES, **extra):
    """Counts of the LENGTH-token answers over num_samples seeds; extra: more SamplingParams."""
    counts = {}
    for seed in range(num_samples):
        sp = SamplingParams(
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            seed=seed,
            max_tokens=LENGTH,
            **{"ignore_eos": True, **extra},
        )
        result = engine.generate(prompt_ids=PROMPT, sampling=sp, speculation=speculation, drafters=drafters)
        key = tuple(result.token_ids)
        counts[key] = counts.get(key, 0) + 1
    return counts


def check(counts, joint):
    cells = [s for s, p in joint.items() if p > 0]
    impossible = sum(c for s, c in counts.items() if joint.get(s, 0) == 0)
    assert impossible == 0, "sampled a continuation of probability 0"
    observed = np.array([counts.get(s, 0) for s in cells], dtype=np.float64)
    expected = np.array([joint[s] for s in cells]) * observed.sum()
    # Merge rare cells so that expected counts are >= 5 (chi-square validity).
    order = np.argsort(expected)
    obs_sorted, exp_sorted = observed[order], expected[order]
    small = np.cumsum(exp_sorted) < 5 * 4
    obs = np.append(obs_sorted[~small], obs_sorted[small].sum())
    exp = np.append(exp_sorted[~small], exp_sorted[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    stat, p_value = chisquare(obs, exp)
    assert p_value > 1e-3, f"chi2={stat:.1f} p={p_value:.2e}"


TARGET = ToyModel(vocab_size=VOCAB, order=2, seed=11, sharpness=1.2, eos_bias=0.0)
DRAFT = ToyModel(vocab_size=VOCAB, order=1, seed=5, sharpness=1.0, eos_bias=0.0)


@pytest.mark.parametrize("draft_temperature", [None, 0.0, 0.5, 1.5])
def test_draft_model_joint_distribution(draft_temperature):
    engine = Engine(ToyBackend(TARGET), [ModelDrafter(ToyBackend(DRAFT), name="draft")])
    params = SamplingParams(temperature=1.0)
    spec = SpeculationConfig(policy="fixed", max_draft_tokens=2, draft_temperature=draft_temperature)
    check(sample_joint(engine, params, spec, ["draft"]), exact_joint(TARGET, params))


def test_ngram_joint_distribution_with_filters():
    engine = Engine(ToyBackend(TARGET), [NgramDrafter(1, 2)])
    params = SamplingParams(temperature=0.8, top_k=4, top_p=0.9)
    spec = SpeculationConfig(policy="fixed", max_draft_tokens=3)
    check(sample_joint(engine, params, spec, ["ngram"]), exact_joint(TARGET, params))


def test_detects_a_biased_sampler():
    """Negative control: plain samples at the wrong temperature fail the same check."""
    engine = Engine(ToyBackend(TARGET))
    counts = sample_joint(engine, SamplingParams(temperature=1.3), SpeculationConfig(enabled=False), [])
    with pytest.raises(AssertionError):
        check(counts, exact_joint(TARGET, SamplingParams(temperature=1.0)))


@pytest.mark.parametrize("prediction", [[3, 1, 2], [2, 2, 2, 2], [4, 0, 1]])
def test_prediction_joint_distribution(prediction):
    """A prediction is a deterministic draft: sampled answers keep the target's distribution."""
    from draftwise.drafters.prediction import PredictionDrafter

    engine = Engine(ToyBackend(TARGET), [PredictionDrafter()])
    params = SamplingParams(temperature=1.0)
    spec = SpeculationConfig(policy="fixed", max_draft_tokens=3, prediction=prediction)
    check(sample_joint(engine, params, spec, ["prediction"]), exact_joint(TARGET, params))
