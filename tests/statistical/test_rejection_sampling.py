"""Chi-square goodness of fit: speculative sampling reproduces the target distribution.

For each draft/target pair, the first committed token (accepted draft token or the
recovered one) must follow the target distribution at that position. 60k samples per
case detect a 1% absolute shift in a 0.2-probability token (chi2 contribution ~18).
"""

import numpy as np
import pytest
from scipy.stats import chisquare

from draftwise.sampling import distribution, sample, softmax
from draftwise.types import Draft, SamplingParams
from draftwise.verify import rejection_sample

NUM_SAMPLES = 60_000
P_THRESHOLD = 1e-3


def first_token_counts(target_rows, draft_row, num_samples=NUM_SAMPLES, seed=0, verifier=rejection_sample):
    """target_rows [2, V]; draft_row [V] or an int (deterministic draft token)."""
    rng = np.random.default_rng(seed)
    vocab = target_rows.shape[1]
    counts = np.zeros(vocab, dtype=np.int64)
    for _ in range(num_samples):
        if isinstance(draft_row, int):
            draft = Draft((draft_row,), None)
        else:
            token = sample(draft_row, rng)
            draft = Draft((token,), draft_row[None, :])
        verdict = verifier(draft, target_rows, rng)
        first = draft.token_ids[0] if verdict.num_accepted >= 1 else verdict.next_token
        counts[first] += 1
    return counts


def assert_matches(counts, expected_probs):
    expected_probs = np.asarray(expected_probs, dtype=np.float64)
    zero = expected_probs == 0
    assert counts[zero].sum() == 0, f"sampled tokens the target gives probability 0: {np.nonzero(counts * zero)[0]}"
    observed = counts[~zero]
    expected = expected_probs[~zero] * counts.sum()
    stat, p_value = chisquare(observed, expected)
    assert p_value > P_THRESHOLD, f"chi2={stat:.1f}, p={p_value:.2e}: observed {observed}, expected {expected.round()}"


def rows(first, second=None):
    first = np.asarray(first, dtype=np.float64)
    first = first / first.sum()
    second = first if second is None else np.asarray(second, dtype=np.float64) / np.sum(second)
    return np.stack([first, second])


CASES = {
    "equal": ([0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]),
    "overlapping": ([0.5, 0.2, 0.2, 0.1, 0.0], [0.1, 0.1, 0.3, 0.3, 0.2]),
    "disjoint_support": ([0.6, 0.4, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]),
    "zero_containing": ([0.0, 0.3, 0.0, 0.7], [0.25, 0.25, 0.25, 0.25]),
    "draft_sharper": ([0.3, 0.3, 0.2, 0.2], [0.9, 0.05, 0.03, 0.02]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sampled_draft_reproduces_target(name):
    target, draft = CASES[name]
    target_rows = rows(target)
    draft_row = np.asarray(draft) / np.sum(draft)
    assert_matches(first_token_counts(target_rows, draft_row), target_rows[0])


@pytest.mark.parametrize("token", [0, 2, 3])
def test_deterministic_draft_reproduces_target(token):
    target_rows = rows([0.5, 0.0, 0.3, 0.2])  # token 1 impossible: always rejected
    assert_matches(first_token_counts(target_rows, token, num_samples=40_000), target_rows[0])


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=0.2),
    ],
    ids=["temperature", "top_k", "top_p", "min_p"],
)
def test_transforms_reproduce_transformed_target(params):
    rng = np.random.default_rng(42)
    target_logits = rng.standard_normal((2, 8)) * 1.5
    draft_logits = target_logits + rng.standard_normal((2, 8))  # a related but different draft
    target_rows = distribution(target_logits, params)
    draft_row = softmax(draft_logits[0], 0.9)  # the draft's own temperature
    assert_matches(first_token_counts(target_rows, draft_row), target_rows[0])


def test_bonus_token_follows_next_position():
    """With draft == target every draft token passes and the bonus comes from row k."""
    rng = np.random.default_rng(3)
    target_rows = rows([0.2, 0.8], [0.7, 0.3])
    counts = np.zeros(2, dtype=np.int64)
    for _ in range(40_000):
        token = sample(target_rows[0], rng)
        verdict = rejection_sample(Draft((token,), target_rows[:1]), target_rows, rng)
        assert verdict.num_accepted == 1
        counts[verdict.next_token] += 1
    assert_matches(counts, target_rows[1])


def test_chi_square_catches_a_wrong_residual():
    """Negative control: resampling from the target instead of the residual is biased."""

    def broken(draft, target_rows, rng):
        for i, token in enumerate(draft.token_ids):
            if rng.random() * draft.draft_probs[i, token] < target_rows[i, token]:
                continue
            from draftwise.types import Verdict

            return Verdict(i, sample(target_rows[i], rng))
        from draftwise.types import Verdict

        return Verdict(len(draft.token_ids), sample(target_rows[-1], rng))

    target, draft = CASES["overlapping"]
    target_rows = rows(target)
    counts = first_token_counts(target_rows, np.asarray(draft), verifier=broken)
    with pytest.raises(AssertionError):
        assert_matches(counts, target_rows[0])
