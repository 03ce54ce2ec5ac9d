"""Suffix/history and retrieval-datastore drafters with literal token lists."""

import numpy as np
import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.drafters.continuation import frequency_walk
from draftwise.drafters.datastore import DatastoreDrafter, build_datastore, suffix_array
from draftwise.drafters.suffix import LIVE_BONUS, SuffixDrafter
from draftwise.engine import Engine
from draftwise.types import SamplingParams, SpeculationConfig


def test_frequency_walk_docstring_example():
    tokens = list("abxabxaby")
    positions = [2, 5, 8]  # after each "ab"
    proposal, conf = frequency_walk(lambda p: tokens[p] if p < len(tokens) else None, positions, 3)
    assert proposal[0] == "x" and conf[0] == pytest.approx(2 / 3)


def test_suffix_drafter_docstring_example():
    d = SuffixDrafter(min_n=2)
    d.propose([1, 2, 3, 4], 2)  # request 1
    assert d.propose([9, 2, 3], 2).token_ids == (4,)  # request 2 finds it in history
    assert d.num_history_tokens == 4


def test_suffix_drafter_picks_most_frequent_continuation():
    d = SuffixDrafter(min_n=2, min_confidence=0.0)
    for doc in ([1, 5, 6, 7, 8], [2, 5, 6, 7, 8], [3, 5, 6, 9, 9]):
        d.propose(doc, 1)
    draft = d.propose([4, 5, 6], 3)
    assert draft.token_ids == (7, 8)
    assert d.last_confidences[0] == pytest.approx(2 / 3)


def test_suffix_drafter_no_match_and_tie_prefers_longer_match():
    d = SuffixDrafter(min_n=2)
    assert d.propose([1, 2, 3], 4).token_ids == ()
    d.propose([7, 1, 2, 3, 40], 1)
    d.propose([8, 1, 2, 3, 50], 1)
    # The longer backward match (8, 1, 2, 3) decides, despite the tie in frequency.
    assert d.propose([0, 8, 1, 2, 3], 1).token_ids == (50,)


def test_suffix_drafter_prefers_the_live_context_over_a_slightly_longer_history_match():
    d = SuffixDrafter(min_n=2)
    d.propose([7, 1, 2, 3, 40], 1)  # history: (7, 1, 2, 3) -> 40
    context = [5, 1, 2, 3, 50, 6, 7, 1, 2, 3]  # live: (1, 2, 3) -> 50, history matches 4 tokens
    draft = d.propose(context, 1)
    assert draft.token_ids == (50,) and draft.kind == "live" and draft.score == 3


def test_suffix_drafter_takes_a_much_longer_history_match():
    d = SuffixDrafter(min_n=2)
    earlier = list(range(100, 100 + LIVE_BONUS + 4))
    d.propose([*earlier, 40], 1)
    context = [earlier[-2], earlier[-1], 50, 0, *earlier]  # live matches 2 tokens, history all
    draft = d.propose(context, 1)
    assert draft.token_ids == (40,) and draft.kind == "history" and draft.score == len(earlier)


def test_suffix_drafter_evicts_oldest_history():
    d = SuffixDrafter(max_history_tokens=8, min_n=2)
    d.propose([1, 2, 3, 4], 1)
    d.propose([5, 6, 7, 8], 1)
    d.propose([9, 9, 9, 9], 1)  # retires [5..8]: 8 tokens, budget kept
    d.propose([0], 1)  # retires [9, 9, 9, 9]: [1, 2, 3, 4] is evicted
    assert d.num_history_tokens == 8
    assert d.propose([0, 6, 7], 1).token_ids == (8,)  # extends the live context: nothing retired
    assert d.propose([0, 6, 7, 2, 3], 1).token_ids == ()  # [1, 2, 3, 4] is gone


def test_suffix_array_small():
    assert suffix_array(np.array([2, 1, 2, 1])).tolist() == [3, 1, 2, 0]
    tokens = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5])
    expected = sorted(range(len(tokens)), key=lambda i: tokens[i:].tolist())
    assert suffix_array(tokens).tolist() == expected


@pytest.fixture
def datastore(tmp_path):
    docs = [("a.py", "abcdefgh"), ("b.py", "xyzabcdq"), ("c.py", "abcdefgz")]
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    meta = build_datastore(docs, encode, tmp_path / "ds")
    assert meta["num_docs"] == 3 and meta["num_tokens"] == 24
    return DatastoreDrafter(tmp_path / "ds")


def test_datastore_prefers_the_longer_match(datastore):
    # "zabcd" occurs once (b.py), longer than the three "abcd": its continuation wins.
    assert datastore.propose([ord(c) for c in "zzabcd"], 1).token_ids == (ord("q"),)


def test_datastore_longest_match_and_majority_continuation(datastore):
    draft = datastore.propose([ord(c) for c in "wwabcd"], 4)
    # "abcd" occurs 3 times: followed by e, q, e -> "e"; then "fg" in both; then h or z (tie).
    assert bytes(draft.token_ids[:3]).decode() == "efg"
    assert draft.score == 4


def test_datastore_never_crosses_file_boundaries(datastore):
    # "gh" ends a.py: nothing may be proposed after it, not b.py's first token.
    assert datastore.propose([ord(c) for c in "fgh"], 3).token_ids == ()


def test_datastore_no_match(datastore):
    assert datastore.propose([1000, 1001], 3).token_ids == ()


def test_greedy_equivalence_with_history_drafters(tmp_path):
    model = ToyModel(vocab_size=24, order=2, seed=1, sharpness=3.0)
    build_datastore([("t", "abcabcabdabc")], lambda text: [ord(c) - 96 for c in text], tmp_path / "ds")
    engine = Engine(ToyBackend(model), [SuffixDrafter(), DatastoreDrafter(tmp_path / "ds")])
    for prompt in ([1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 4, 5]):
        plain = engine.generate(
            prompt_ids=prompt, sampling=SamplingParams(max_tokens=50), speculation=SpeculationConfig(enabled=False)
        ).token_ids
        for name in ("suffix", "datastore"):
            for k in (1, 2, 5):
                got = engine.generate(
                    prompt_ids=prompt,
                    sampling=SamplingParams(max_tokens=50),
                    speculation=SpeculationConfig(policy="fixed", max_draft_tokens=k),
                    drafters=[name],
                )
                assert got.token_ids == plain


def test_tree_commits_the_second_branch_when_only_it_matches():
    """Two candidate continuations; the target's greedy path follows the second."""
    from draftwise.types import TreeDraft
    from draftwise.verify import greedy_verify_tree

    assert greedy_verify_tree([[5, 6], [5, 7]], [[5, 9, 1], [5, 7, 3]]) == (
        1,
        __import__("draftwise.types").types.Verdict(2, 3),
    )
    model = ToyModel(vocab_size=24, order=2, seed=1, sharpness=3.0)
    backend = ToyBackend(model)
    prompt = [1, 2, 3]
    truth, ctx = [], list(prompt)
    for _ in range(4):
        truth.append(int(model.logits(ctx).argmax()))
        ctx.append(truth[-1])
    wrong = [(truth[0] + 1) % 24, truth[1], truth[2]]
    backend.prefill(prompt[:-1])
    logits = backend.extend_tree(prompt[-1], [wrong, truth[:3]])
    branch, verdict = greedy_verify_tree([wrong, truth[:3]], [x.argmax(-1) for x in logits])
    assert (branch, verdict.num_accepted, verdict.next_token) == (1, 3, truth[3])
    backend.commit_branch(branch, verdict.num_accepted)
    assert backend.cached_ids == prompt + truth[:3]
    assert len(TreeDraft(((1, 2), (1, 3)))) == 3  # the shared first token counts once


@pytest.mark.parametrize("branches", [2, 4])
def test_tree_greedy_equivalence_toy(branches):
    model = ToyModel(vocab_size=12, order=2, seed=4, sharpness=2.5)
    from draftwise.drafters import NgramDrafter

    engine = Engine(ToyBackend(model), [NgramDrafter(1, 2)])
    prompt = [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]
    plain = engine.generate(
        prompt_ids=prompt, sampling=SamplingParams(max_tokens=60), speculation=SpeculationConfig(enabled=False)
    ).token_ids
    tree = engine.generate(
        prompt_ids=prompt,
        sampling=SamplingParams(max_tokens=60),
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4, max_branches=branches),
    )
    assert tree.token_ids == plain
    assert tree.stats.num_tree_steps > 0


def test_suffix_snapshot_restore_forgets_later_requests():
    d = SuffixDrafter(min_n=2)
    d.propose([1, 2, 3, 4], 1)
    state = d.snapshot()
    d.propose([7, 5, 6, 9], 1)
    d.propose([0], 1)
    assert d.propose([0, 5, 6], 1).token_ids == (9,)
    d.restore(state)
    assert d.propose([0, 5, 6], 1).token_ids == ()  # the later request is gone
    assert d.propose([0, 5, 6, 2, 3], 1).token_ids == (4,)  # the earlier one stays


def test_trees_fall_back_to_chains_when_sampling():
    from draftwise.drafters import NgramDrafter

    engine = Engine(ToyBackend(ToyModel(vocab_size=12, order=2, seed=4)), [NgramDrafter(1, 2)])
    result = engine.generate(
        prompt_ids=[1, 2, 3, 1, 2, 4, 1, 2],
        sampling=SamplingParams(temperature=1.0, seed=3, max_tokens=40),
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4, max_branches=3),
    )
    assert result.stats.num_tree_steps == 0 and result.stats.num_drafted > 0


def _longest_suffix_in(context, docs, min_n, cap):
    """Brute force: the longest suffix of context (length >= min_n, <= cap) found in a doc
    followed by at least one token, and the continuations after its occurrences."""
    best, where = 0, []
    for n in range(min_n, min(cap, len(context)) + 1):
        pattern = context[-n:]
        found = [(d, i + n) for d, doc in enumerate(docs) for i in range(len(doc) - n) if doc[i : i + n] == pattern]
        if found:
            best, where = n, found
    return best, where


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

small_docs = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=30), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(history=small_docs, context=st.lists(st.integers(0, 3), min_size=2, max_size=30))
def test_suffix_match_length_equals_brute_force(history, context):
    drafter = SuffixDrafter(min_n=2)
    for doc in history:  # earlier requests
        drafter.match(doc)
    drafter.match([99])  # retire the last one
    _, length = drafter.match(context)
    # Occurrences may lie in history or earlier in the live context (before its last token);
    # the live one wins unless history's is longer by more than LIVE_BONUS.
    live, _ = _longest_suffix_in(context, [context], 2, 64)
    past, _ = _longest_suffix_in(context, history, 2, 64)
    expected = live if live and live + LIVE_BONUS >= past else past
    assert length == expected
    assert drafter.last_kind == (
        "" if not expected else "live" if expected == live and live + LIVE_BONUS >= past else "history"
    )


@settings(max_examples=60, deadline=None)
@given(docs=small_docs, context=st.lists(st.integers(0, 3), min_size=1, max_size=20))
def test_datastore_match_equals_brute_force(tmp_path_factory, docs, context):
    path = tmp_path_factory.mktemp("ds") / "ds"
    build_datastore([(f"{i}.txt", doc) for i, doc in enumerate(docs)], list, path)
    length, where = _longest_suffix_in(context, docs, 2, 10**6)
    positions, got = DatastoreDrafter(path).match(context)
    assert got == length
    if length:
        offsets = np.cumsum([0] + [len(d) + 1 for d in docs])  # +1: each doc's separator
        assert sorted(positions) == sorted(int(offsets[d] + p) for d, p in where)
