"""Lazy constraints stay lossless: answers of up to 3 tokens sampled with speculation under a
lazy grammar (free text until token "a", then [bc][a-d]) follow the exact joint distribution
of the toy target with each row masked by the lazy grammar's state at its position, computed
by enumeration. Drafts of 2 tokens cross the trigger (a draft "x a" has its bonus row under the
grammar, "a b" its second row), for the draft model, prompt lookup and the grammar drafter.
"""

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

# slow: each check samples thousands of sequences under a grammar for chi-square power
pytestmark = pytest.mark.slow

LAZY = Constraint.lazy(Constraint.regex("[bc][a-d]"), "a")  # tokens: 0 EOS, 1 a, 2 b, 3 c, 4 d
NUM_SAMPLES = 8_000


def exact_lazy_joint(params: SamplingParams, *, bug: bool = False) -> dict[tuple[int, ...], float]:
    """P(answer) for every answer (EOS ends one and is not part of it; LENGTH tokens at most).
    bug: the row right after the trigger left unmasked (a bonus row sampled without the mask)."""
    joint: dict[tuple[int, ...], float] = {}

    def walk(seq: tuple[int, ...], prob: float, grammar) -> None:
        if len(seq) == LENGTH or prob == 0:
            joint[seq] = joint.get(seq, 0.0) + prob
            return
        allowed = grammar.allowed()
        if bug and seq and seq[-1] == 1 and 1 not in seq[:-1]:
            allowed = np.ones(VOCAB, dtype=bool)
        logits = np.where(allowed, TARGET.logits([*PROMPT, *seq]), -np.inf)
        probs = distribution(logits[None, :], params)[0]
        for token in range(VOCAB):
            if probs[token] == 0:
                continue
            if token == 0:
                joint[seq] = joint.get(seq, 0.0) + prob * probs[0]
                continue
            g = grammar.fork()
            if grammar.allowed()[token]:
                g.consume([token])
            walk((*seq, token), prob * probs[token], g)

    walk((), 1.0, compile_constraint(LAZY, ToyBackend(TARGET)))
    return joint


def engine():
    return Engine(
        ToyBackend(TARGET), [ModelDrafter(ToyBackend(DRAFT), name="draft"), NgramDrafter(1, 2), GrammarDrafter()]
    )


@pytest.mark.parametrize("drafter", ["draft", "ngram", "grammar"])
def test_lazy_joint_distribution(drafter):
    params = SamplingParams(temperature=1.0)
    spec = SpeculationConfig(policy="fixed", max_draft_tokens=2)
    counts = sequence_level.sample_joint(engine(), params, spec, [drafter], NUM_SAMPLES, constraint=LAZY)
    joint = exact_lazy_joint(params)
    assert sum(p for s, p in joint.items() if 1 in s[:-1]) > 0.1  # the grammar takes hold often
    check(counts, joint)


def test_detects_the_row_after_the_trigger_left_unmasked():
    """Negative control: the same answers fail against a joint whose first row after the
    trigger is unmasked (the bug class of a bonus row sampled without the grammar)."""
    params = SamplingParams(temperature=1.0)
    counts = sequence_level.sample_joint(
        engine(), params, SpeculationConfig(policy="fixed", max_draft_tokens=2), ["draft"], NUM_SAMPLES, constraint=LAZY
    )
    buggy = exact_lazy_joint(params, bug=True)
    with pytest.raises(AssertionError, match="chi2"):
        check(counts, {s: p for s, p in buggy.items() if s in counts or p > 0})
