"""Chi-square: a draft model of ANOTHER vocabulary (drafters/crossvocab.py) keeps the target's
distribution exactly, at the step (first committed token) and the sequence level (3-token
answers, against the joint by enumeration), at several temperatures, top-k and top-p. Negative
controls: a verifier fed the draft's restricted distribution without renormalising, or its rows
mapped to the wrong target ids, fails the same checks.
"""

import numpy as np
import pytest
from statistical.test_rejection_sampling import assert_matches
from statistical.test_sequence_level import check

from draftwise.backends.toy import CharTokenizer, PieceTokenizer, ToyBackend, ToyModel
from draftwise.drafters.crossvocab import CrossVocabDrafter
from draftwise.engine import Engine
from draftwise.sampling import distribution, softmax
from draftwise.types import Draft, SamplingParams, SpeculationConfig
from draftwise.verify import rejection_sample

# slow: each sequence-level check samples 12,000 answers, each step-level one 30,000 first tokens
pytestmark = pytest.mark.slow

TARGET_TOK = CharTokenizer(6, "abcde")  # </s> a b c d e
# Shared: a, c, e, b, d at other ids; "ab", "x", "dd" are the draft's own (a third of its mass).
DRAFT_TOK = PieceTokenizer(["a", "c", "ab", "e", "x", "dd", "b", "d"])
TARGET = ToyModel(vocab_size=6, order=2, seed=11, sharpness=1.2, eos_bias=0.0)
DRAFT = ToyModel(vocab_size=9, order=1, seed=5, sharpness=1.0, eos_bias=0.0)
PROMPT = [1, 2, 1, 2, 1]
NUM_STEP_SAMPLES = 30_000

SETTINGS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.6),
    SamplingParams(temperature=1.4, top_k=3),
    SamplingParams(temperature=0.9, top_p=0.8),
]


def make_drafter(cls=None, level="token"):
    backend = ToyBackend(DRAFT, tokenizer=DRAFT_TOK)
    return (cls or CrossVocabDrafter)(backend, TARGET_TOK, 6, name="draft", draft_level=level)


def first_tokens(params, feed=None, num_samples=NUM_STEP_SAMPLES):
    """Counts of the first committed token after PROMPT: the drafter proposes one token, the
    verifier checks it against the target's row (feed: what the verifier is given instead of the
    draft's rows)."""
    d = make_drafter()
    target_rows = np.stack([distribution(TARGET.logits(PROMPT)[None, :], params)[0]] * 2)
    rng = np.random.default_rng(0)
    counts = np.zeros(6, dtype=np.int64)
    for seed in range(num_samples):
        d.begin(SamplingParams(**{**params.__dict__, "seed": seed}), SpeculationConfig(), prompt=PROMPT)
        draft = d.propose(PROMPT, 1)
        assert len(draft) == 1
        if feed is not None:
            draft = Draft(draft.token_ids, feed(draft.draft_probs))
        verdict = rejection_sample(draft, target_rows, rng)
        counts[draft.token_ids[0] if verdict.num_accepted else verdict.next_token] += 1
    return counts, target_rows[0]


@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_first_token_follows_the_target(params):
    counts, expected = first_tokens(params)
    assert_matches(counts, expected)


def test_an_unrenormalised_draft_distribution_fails_the_step_check():
    """Negative control: the verifier told the draft's restricted probabilities before
    renormalising (each scaled by the shared tokens' mass, here about two thirds) biases the
    first token, and the same check sees it."""
    params = SamplingParams(temperature=1.0)
    d = make_drafter()
    draft_probs = softmax(DRAFT.logits(d.backend.tokenizer.encode("ababa"))[None, :])[0]
    mass = float(draft_probs[d.vocab.draft_ids].sum())
    assert 0.4 < mass < 0.85, mass  # enough mass outside the shared tokens for the bias to show
    counts, expected = first_tokens(params, feed=lambda rows: rows * mass)
    with pytest.raises(AssertionError):
        assert_matches(counts, expected)


# ---------------------------------------------------------------------------- sequence level
def exact_joint(params):
    import itertools

    joint = {}
    for seq in itertools.product(range(6), repeat=3):
        prob, context = 1.0, list(PROMPT)
        for token in seq:
            prob *= distribution(TARGET.logits(context)[None, :], params)[0, token]
            context.append(token)
        joint[seq] = prob
    return joint


def sample_answers(drafter, params, num_samples=12_000, k=2):
    engine = Engine(ToyBackend(TARGET, tokenizer=TARGET_TOK), [drafter])
    spec = SpeculationConfig(policy="fixed", max_draft_tokens=k)
    counts, num_drafted = {}, 0
    for seed in range(num_samples):
        sp = SamplingParams(**{**params.__dict__, "seed": seed, "max_tokens": 3, "ignore_eos": True})
        result = engine.generate(prompt_ids=PROMPT, sampling=sp, speculation=spec, drafters=["draft"])
        counts[tuple(result.token_ids)] = counts.get(tuple(result.token_ids), 0) + 1
        num_drafted += result.stats.num_drafted
    assert num_drafted > num_samples  # the draft drafted: the check is about its tokens
    return counts


@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_answers_follow_the_target_joint(params):
    check(sample_answers(make_drafter(), params), exact_joint(params))


class WronglyMapped(CrossVocabDrafter):
    """Hands the verifier its rows with two target ids' probabilities swapped ("a" and "b"):
    the tokens are the drafter's own, the distribution it reports is not."""

    def propose(self, context, max_tokens, grammar=None):
        draft = super().propose(context, max_tokens, grammar)
        if draft.draft_probs is None:
            return draft
        rows = draft.draft_probs.copy()
        rows[:, [1, 2]] = rows[:, [2, 1]]
        return Draft(draft.token_ids, rows, source=draft.source)


def test_a_wrongly_mapped_draft_distribution_fails_the_sequence_check():
    params = SamplingParams(temperature=1.0)
    counts = sample_answers(make_drafter(WronglyMapped), params)
    with pytest.raises(AssertionError):
        check(counts, exact_joint(params))


# ---------------------------------------------------------------------------- string level
def test_string_drafts_follow_the_target_joint():
    """The draft's own text ("ab", "dd" included) re-encoded and verified as a deterministic draft."""
    params = SamplingParams(temperature=1.0)
    check(sample_answers(make_drafter(level="string"), params, num_samples=6000, k=3), exact_joint(params))


class Overclaimed(CrossVocabDrafter):
    """Tells the verifier its string draft had probability 1/2 (not 1): each token is then
    accepted with min(1, 2 target(x)), too often."""

    def propose(self, context, max_tokens, grammar=None):
        draft = super().propose(context, max_tokens, grammar)
        rows = np.full((len(draft), 6), 0.1)
        rows[np.arange(len(draft)), list(draft.token_ids)] = 0.5
        return Draft(draft.token_ids, rows if len(draft) else None, source=draft.source)


def test_an_overclaimed_string_draft_fails_the_sequence_check():
    params = SamplingParams(temperature=1.0)
    counts = sample_answers(make_drafter(Overclaimed, level="string"), params, num_samples=6000, k=3)
    with pytest.raises(AssertionError):
        check(counts, exact_joint(params))
