"""Constrained sampling stays lossless: 3-token answers sampled with speculation under a
grammar follow the exact masked joint distribution of the toy target (mask, then the
sampling transforms), computed by enumeration. The grammar allows 2 tokens at the first
position, 4 at the second and 1 (forced) at the third; the n-gram drafter proposes tokens
the grammar forbids, the draft model drafts under the grammar.
"""

import itertools

import numpy as np
import pytest

from draftwise.backends.toy import ToyBackend
from draftwise.constraints import Constraint, compile_constraint
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.engine import Engine
from draftwise.sampling import distribution
from draftwise.types import SamplingParams, SpeculationConfig
from tests.statistical import test_sequence_level as sequence_level
from tests.statistical.test_sequence_level import DRAFT, LENGTH, PROMPT, TARGET, VOCAB, check

# slow: each check samples thousands of constrained sequences (grammar masks per token) for chi-square power
pytestmark = pytest.mark.slow

CONSTRAINT = Constraint.regex("[ab][a-d]c[a-d]*")  # tokens: 0 EOS, 1 a, 2 b, 3 c, 4 d
NUM_SAMPLES = 8_000


def exact_masked_joint(params: SamplingParams) -> dict[tuple[int, ...], float]:
    grammar = compile_constraint(CONSTRAINT, ToyBackend(TARGET))
    joint = {}
    for seq in itertools.product(range(VOCAB), repeat=LENGTH):
        prob, context, g = 1.0, list(PROMPT), grammar.fork()
        for token in seq:
            logits = np.where(g.allowed(), TARGET.logits(context), -np.inf)
            prob *= distribution(logits[None, :], params)[0, token]
            if prob == 0:
                break
            g.consume([token])
            context.append(token)
        joint[seq] = prob
    return joint


def sample_joint(engine, params, speculation, drafters):
    return sequence_level.sample_joint(engine, params, speculation, drafters, NUM_SAMPLES, constraint=CONSTRAINT)


def engine():
    return Engine(
        ToyBackend(TARGET), [ModelDrafter(ToyBackend(DRAFT), name="draft"), NgramDrafter(1, 2), GrammarDrafter()]
    )


@pytest.mark.parametrize("drafter", ["draft", "ngram", "grammar"])
def test_constrained_joint_distribution(drafter):
    params = SamplingParams(temperature=1.0)
    spec = SpeculationConfig(policy="fixed", max_draft_tokens=2)
    check(sample_joint(engine(), params, spec, [drafter]), exact_masked_joint(params))


def test_constrained_joint_distribution_with_filters():
    params = SamplingParams(temperature=0.8, top_k=2, top_p=0.9)
    spec = SpeculationConfig(policy="fixed", max_draft_tokens=2)
    check(sample_joint(engine(), params, spec, ["draft"]), exact_masked_joint(params))


def test_detects_sampling_without_the_mask():
    """Negative control: the unmasked target distribution fails the same check."""
    from tests.statistical.test_sequence_level import exact_joint

    params = SamplingParams(temperature=1.0)
    counts = sample_joint(engine(), params, SpeculationConfig(policy="fixed", max_draft_tokens=2), ["draft"])
    with pytest.raises(AssertionError):
        check(counts, exact_joint(TARGET, params))
