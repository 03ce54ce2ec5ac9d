"""Lookup drafters at long context: a new request's context keeps the index of what it shares
with the last one (the n-gram index after taking tokens back equals one built afresh), and within
a request the index trusts the growing context, so a step's lookup does not compare the whole
context again (checked by counting, not timing: the list the drafter compares is never copied in
full after the request's first lookup)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from draftwise.backends.base import common_prefix_length
from draftwise.drafters import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.types import SamplingParams, SpeculationConfig


def index_of(drafter: NgramDrafter) -> dict:
    return {n: {k: list(v) for k, v in table.items() if v} for n, table in drafter._index.items()}


@settings(max_examples=60, deadline=None)
@given(
    first=st.lists(st.integers(0, 5), max_size=60),
    second=st.lists(st.integers(0, 5), max_size=60),
    shared=st.integers(0, 60),
)
def test_taking_tokens_back_leaves_the_index_a_fresh_build_would_have(first, second, shared):
    a = first
    b = first[:shared] + second
    drafter = NgramDrafter(1, 3)
    drafter.propose(a, 4)
    drafter.propose(b, 4)
    fresh = NgramDrafter(1, 3)
    fresh.propose(b, 4)
    assert drafter._tokens == b
    assert index_of(drafter) == index_of(fresh)
    assert drafter.propose(b, 4) == fresh.propose(b, 4)


@given(a=st.lists(st.integers(0, 3), max_size=40), b=st.lists(st.integers(0, 3), max_size=40))
def test_common_prefix(a, b):
    n = common_prefix_length(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]


class CountingList(list):
    """A context that counts how many of its items are sliced out (the drafter's comparisons)."""

    sliced = 0

    def __getitem__(self, item):
        got = super().__getitem__(item)
        if isinstance(item, slice):
            CountingList.sliced += len(got)
        return got


def test_within_a_request_a_lookup_does_not_compare_the_whole_context_again():
    rng = np.random.default_rng(0)
    prompt = [int(x) for x in rng.integers(0, 50, size=20_000)]
    for drafter in (NgramDrafter(1, 4), SuffixDrafter()):
        drafter.begin(SamplingParams(), SpeculationConfig(), prompt)
        context = CountingList(prompt)
        drafter.propose(context, 8)  # the request's first lookup: compared (and indexed) in full
        CountingList.sliced = 0
        for _ in range(100):  # the request's steps: the context grows by committed tokens
            context.append(int(rng.integers(0, 50)))
            drafter.propose(context, 8)
        assert CountingList.sliced < 100 * 1_000, (type(drafter).__name__, CountingList.sliced)
        # A new request with another context is compared in full again and indexed anew.
        drafter.begin(SamplingParams(), SpeculationConfig(), prompt[:100])
        other = prompt[:100] + [7, 7, 7]
        if isinstance(drafter, NgramDrafter):
            assert drafter.propose(other, 8) == NgramDrafter(1, 4).propose(other, 8)
        else:  # the last request's context went to history; the live one is the new context
            drafter.propose(other, 8)
            assert drafter._tokens[drafter._live_start :] == other
