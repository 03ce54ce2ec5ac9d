"""Drafters with literal token lists."""

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.types import SamplingParams, SpeculationConfig


def test_ngram_docstring_example():
    d = NgramDrafter(min_n=1, max_n=2)
    assert d.propose([1, 2, 3, 9, 1, 2], 3).token_ids == (3, 9, 1)


def test_ngram_no_match_is_empty_draft():
    d = NgramDrafter(min_n=2, max_n=3)
    draft = d.propose([1, 2, 3, 4, 5], 4)
    assert draft.token_ids == () and draft.draft_probs is None


def test_ngram_prefers_longest_backward_match_then_earliest():
    # suffix (7, 8): occurs after 5 (start 3) and after 6 (start 8); the context ends ..., 6, 7, 8
    context = [5, 7, 8, 1, 1, 6, 7, 8, 2, 2, 0, 6, 7, 8]
    assert NgramDrafter(2, 2).propose(context, 2).token_ids == (2, 2)
    # ties in backward length go to the earliest occurrence
    context = [7, 8, 1, 7, 8, 2, 7, 8]
    assert NgramDrafter(2, 2).propose(context, 1).token_ids == (1,)


def test_ngram_longer_n_wins():
    context = [3, 4, 10, 1, 2, 4, 11, 1, 2, 3, 4]
    assert NgramDrafter(1, 3).propose(context, 1).token_ids == (10,)


def test_ngram_incremental_index_equals_fresh_and_resets_on_new_context():
    incremental = NgramDrafter(1, 3)
    seq = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 1, 2]
    for n in range(2, len(seq) + 1):
        assert incremental.propose(seq[:n], 3) == NgramDrafter(1, 3).propose(seq[:n], 3)
    assert incremental.propose([9, 8, 9], 2).token_ids == (8, 9)  # unrelated context: rebuilt


def test_ngram_bounded_by_max_tokens_and_reports_match_length():
    draft = NgramDrafter(1, 4).propose([1, 2, 3, 4, 5, 6, 1, 2, 3], 2)
    assert draft.token_ids == (4, 5) and draft.score == 3


def test_model_drafter_greedy_and_rollback():
    model = ToyModel(vocab_size=12, seed=3)
    drafter = ModelDrafter(ToyBackend(model))
    drafter.begin(SamplingParams(), SpeculationConfig())
    context = [1, 2, 3]
    draft = drafter.propose(context, 4)
    expected, ctx = [], list(context)
    for _ in range(4):
        expected.append(int(model.logits(ctx).argmax()))
        ctx.append(expected[-1])
    assert list(draft.token_ids) == expected and draft.draft_probs is None
    # After a rejection at position 1 the cache is re-synced to the new committed context.
    new_context = context + [expected[0], 7]
    drafter.propose(new_context, 2)
    assert drafter.backend.cached_ids[: len(new_context)] == new_context


def test_model_drafter_sampled_probs_are_its_own_distribution():
    drafter = ModelDrafter(ToyBackend(ToyModel(vocab_size=12, seed=3)))
    drafter.begin(SamplingParams(temperature=1.0, seed=0), SpeculationConfig(draft_temperature=0.5))
    draft = drafter.propose([1, 2], 3)
    assert draft.draft_probs.shape == (3, 12)
    assert all(draft.draft_probs[i, t] > 0 for i, t in enumerate(draft.token_ids))


def test_ngram_scores_a_match_by_its_margin_over_a_rival_continuation():
    """A long context repeats phrases with different continuations: the proposal's score is its
    backward match less the longest match that goes on with another token (the evidence that
    tells the sources apart), and the full match length where every match agrees."""
    # (1, 2) occurs after 9, 5 (continues 3) and after 5 alone (continues 4); the end is 9, 5, 1, 2
    context = [9, 5, 1, 2, 3, 0, 5, 1, 2, 4, 0, 9, 5, 1, 2]
    drafter = NgramDrafter(2, 2)
    draft = drafter.propose(context, 1)
    assert draft.token_ids == (3,) and drafter.last_match_length == 4 and draft.score == 1  # 4 less 3
    # both earlier occurrences continue alike: no rival, the whole match length
    agree = [9, 5, 1, 2, 3, 0, 5, 1, 2, 3, 0, 9, 5, 1, 2]
    assert NgramDrafter(2, 2).propose(agree, 1).score == 4
