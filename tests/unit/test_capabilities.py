"""Backends declare what they can do (Capabilities) and callers act on the declaration: a
backend that declares no batching gets one forward per sequence, no trees gets chains, no
prefix sharing reads a prompt again. Each backend declares its own, its sequences theirs.
"""

from dataclasses import replace

import numpy as np
import pytest

from draftwise.backends.base import Capabilities, extend_batch, num_slots
from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.batching import MIN_SHARED, Batcher
from draftwise.drafters import NgramDrafter
from draftwise.engine import Engine
from draftwise.types import SamplingParams, SpeculationConfig

TARGET = ToyModel(vocab_size=12, order=2, seed=3, sharpness=3.0)


def test_toy_declares_its_slots_and_batching():
    backend = ToyBackend(TARGET, slots=3)
    assert backend.capabilities == Capabilities(
        exact=True, dtype="float64", max_branches=16, num_slots=3, batching=True
    )
    assert num_slots(backend) == backend.num_slots == 3 and Engine(backend).num_slots == 3
    assert backend.sequence(1).capabilities.num_slots == 1  # a sequence serves no others


def test_a_backend_that_declares_no_batching_gets_one_forward_per_sequence():
    batched, alone = ToyBackend(TARGET, slots=2), ToyBackend(TARGET, slots=2)
    alone.capabilities = replace(alone.capabilities, batching=False)
    for backend in (batched, alone):
        seqs = [backend.sequence(i) for i in range(2)]
        logits = extend_batch(backend, [(seqs[0], [1, 2, 3], 2), (seqs[1], [4, 5], 1)])
        assert [x.shape for x in logits] == [(2, 12), (1, 12)]
    assert (batched.num_batches, alone.num_batches) == (1, 0)
    first = extend_batch(ToyBackend(TARGET), [(ToyBackend(TARGET), [1, 2, 3], 2)])[0]
    assert np.array_equal(first, ToyBackend(TARGET).extend([1, 2, 3], 2))


@pytest.mark.parametrize("max_branches", [1, 3])
def test_trees_only_where_the_target_declares_branches(max_branches):
    target = ToyBackend(TARGET)
    target.capabilities = replace(target.capabilities, max_branches=max_branches)
    engine = Engine(target, [NgramDrafter(1, 2)])
    prompt = [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]  # (1, 2) is followed three ways: a tree of three
    speculation = SpeculationConfig(policy="fixed", max_draft_tokens=3, max_branches=3)
    sampling = SamplingParams(max_tokens=8, ignore_eos=True)
    result = engine.generate(prompt_ids=prompt, sampling=sampling, speculation=speculation)
    plain = engine.generate(prompt_ids=prompt, sampling=sampling, speculation=SpeculationConfig(enabled=False))
    assert result.token_ids == plain.token_ids
    assert (result.stats.num_tree_steps > 0) == (max_branches > 1)


class Sharing(ToyBackend):
    """A toy backend whose sequences say they share prefixes, and count the times asked."""

    asked: list = []

    def share_prefix(self, source, n: int) -> bool:
        Sharing.asked.append(n)
        return False  # nothing shared: the prompt is read again


@pytest.mark.parametrize("declared", [False, True])
def test_prefix_sharing_is_asked_for_only_where_declared(declared):
    target = ToyBackend(TARGET, slots=2)
    seq = Sharing(TARGET, name="toy#1")
    seq.capabilities = replace(seq.capabilities, prefix_sharing=declared)
    target._slots[1] = seq
    engine = Engine(target)
    prompt = list(range(1, 12)) * 3  # longer than MIN_SHARED
    assert len(prompt) > MIN_SHARED
    sampling = SamplingParams(max_tokens=2, ignore_eos=True)
    engine.generate(prompt_ids=prompt, sampling=sampling)  # slot 0 holds the prompt
    Sharing.asked = []
    batcher = Batcher(engine, slots=[1])
    gen = engine.stream(prompt_ids=prompt, sampling=sampling)
    assert batcher.add(gen, share_from=lambda index: True) == 1
    while batcher.active:
        batcher.step()
    assert gen.result.token_ids == engine.generate(prompt_ids=prompt, sampling=sampling).token_ids
    assert Sharing.asked == ([len(prompt) - 1] if declared else [])  # slot 0's cached prompt
