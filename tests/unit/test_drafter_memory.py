"""Drafters' memory_bytes(): it grows with what a drafter is fed, matches tracemalloc's count of
what its index allocates (an upper estimate from entry counts, never a walk), and stays under the
bound each drafter's docstring states (the suffix history's cap evicts the oldest documents)."""

from __future__ import annotations

import gc
import random
import tracemalloc

import numpy as np
import pytest

from draftwise.backends.toy import CharTokenizer, ToyBackend, ToyModel
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.base import BaseDrafter
from draftwise.drafters.calls import CallsDrafter
from draftwise.drafters.datastore import DatastoreDrafter, build_datastore
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.drafters.prediction import PredictionDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.types import SamplingParams, SpeculationConfig

# The bounds the docstrings state, in bytes a token (every n-gram new, the worst case).
NGRAM_TOKEN_BOUND = 720  # n = 2..4
SUFFIX_TOKEN_BOUND = 260
PREDICTION_TOKEN_BOUND = 240


def text_ids(n: int, seed: int = 0, repeat: float = 0.5, vocab: int = 150_000) -> list[int]:
    """Token ids like a real vocabulary's (mostly past the small-int cache), copying earlier
    stretches of itself with probability `repeat`, as code and edits do."""
    rng = random.Random(seed)
    out: list[int] = []
    while len(out) < n:
        if out and rng.random() < repeat:
            start = rng.randrange(len(out))
            out.extend(out[start : start + rng.randrange(5, 40)])
        else:
            out.extend(rng.randrange(300, vocab) for _ in range(rng.randrange(5, 30)))
    return [int(t) for t in out[:n]]


def allocated(feed) -> int:
    """Bytes feed() leaves allocated (tracemalloc), garbage collected before and after."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        feed()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("repeat", [0.0, 0.5])
def test_ngram_index_estimate_matches_tracemalloc_and_its_bound(repeat):
    context = text_ids(8000, repeat=repeat)
    drafter = NgramDrafter()
    actual = allocated(lambda: drafter.propose(context, 4))
    estimate = drafter.memory_bytes()
    assert actual <= estimate <= 1.3 * actual
    assert estimate <= NGRAM_TOKEN_BOUND * len(context)


def test_ngram_index_grows_with_the_context_and_shrinks_with_a_shorter_one():
    context = text_ids(4000)
    drafter = NgramDrafter()
    assert drafter.memory_bytes() == 0
    sizes = []
    for n in (500, 2000, 4000):
        drafter.propose(context[:n], 4)
        sizes.append(drafter.memory_bytes())
    assert sizes[0] < sizes[1] < sizes[2]
    drafter.propose(context[:500], 4)  # a new request sharing less: the index follows it
    assert drafter.memory_bytes() == sizes[0]


def test_suffix_history_estimate_matches_tracemalloc():
    contexts = [text_ids(1500, seed=i) for i in range(8)]
    drafter = SuffixDrafter()

    def feed():
        for c in contexts:
            drafter.propose(c, 4)

    actual = allocated(feed)
    assert actual <= drafter.memory_bytes() <= 1.3 * actual


def test_suffix_history_grows_then_stays_under_its_cap():
    cap = 3000
    drafter = SuffixDrafter(max_history_tokens=cap)
    sizes = []
    for i in range(40):
        drafter.propose(text_ids(400, seed=i, repeat=0.0), 4)  # each request retires the last
        sizes.append(drafter.memory_bytes())
        assert drafter.num_history_tokens <= cap
        assert drafter.memory_bytes() <= SUFFIX_TOKEN_BOUND * (cap + 400)
    assert sizes[0] < sizes[5]  # it learns ...
    assert max(sizes[20:]) < 1.2 * min(sizes[20:])  # ... and, at the cap, forgets as much
    # A restored snapshot counts what it restored.
    state = drafter.snapshot()
    fresh = SuffixDrafter(max_history_tokens=cap)
    fresh.restore(state)
    assert fresh.memory_bytes() == drafter.memory_bytes()


def test_prediction_index_follows_the_request_prediction():
    drafter = PredictionDrafter()
    assert drafter.memory_bytes() < 100
    sizes = []
    for n in (1000, 6000):
        prediction = tuple(text_ids(n, seed=n))
        actual = allocated(lambda p=prediction: drafter.begin(SamplingParams(), SpeculationConfig(prediction=p)))
        sizes.append(drafter.memory_bytes())
        assert actual <= sizes[-1] <= 1.5 * actual + 8 * n  # the prediction's tuple is the request's own
        assert sizes[-1] <= PREDICTION_TOKEN_BOUND * n
    assert sizes[0] < sizes[1]
    drafter.begin(SamplingParams(), SpeculationConfig())  # the next request without one frees it
    assert drafter.memory_bytes() < 100


def test_a_datastore_counts_its_mapped_files_and_grows_with_nothing(tmp_path):
    texts = [(f"f{i}", "def add(a, b):\n    return a + b\n" * (i + 1)) for i in range(5)]
    build_datastore(texts, lambda t: [ord(c) for c in t], tmp_path)
    drafter = DatastoreDrafter(tmp_path)
    on_disk = np.load(tmp_path / "tokens.npy").nbytes + np.load(tmp_path / "sa.npy").nbytes
    assert drafter.memory_bytes() == on_disk > 0
    drafter.propose([ord(c) for c in "def add(a, b):\n    ret"], 8)
    assert drafter.memory_bytes() == on_disk
    assert drafter.for_slot(1).memory_bytes() == on_disk  # the same mapped files


def test_a_draft_model_counts_its_kv_cache_in_use():
    backend = ToyBackend(ToyModel(vocab_size=30))
    drafter = ModelDrafter(backend)
    assert drafter.memory_bytes() == 0
    drafter.propose([1, 2, 3, 4, 5], 4)
    assert drafter.memory_bytes() == backend.kv_bytes()["used"] > 0
    first = drafter.memory_bytes()
    drafter.propose([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 4)
    assert drafter.memory_bytes() > first


def test_the_calls_drafter_holds_the_answer_text_and_stateless_drafters_nothing():
    tokenizer = CharTokenizer(60)
    drafter = CallsDrafter(tokenizer=tokenizer)
    drafter.begin(SamplingParams(), SpeculationConfig())
    before = drafter.memory_bytes()
    context = tokenizer.encode("call the weather tool for Lisbon please")
    drafter._answer(context[:10])
    drafter._answer(context)
    assert drafter.memory_bytes() > before
    assert GrammarDrafter().memory_bytes() == 0

    class Stateless(BaseDrafter):
        name = "stateless"

    assert Stateless().memory_bytes() == 0
