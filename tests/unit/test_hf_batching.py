"""Continuous batching on the transformers backend: a tiny random Qwen2 in float64 with slots.

One padded forward over several sequences (different cached lengths, draft rows, prompt
chunks) must give each sequence the logits and cache a forward of its own gives it; the
Batcher's greedy outputs over such slots equal single-request outputs.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from draftwise.backends.base import BackendError
from draftwise.backends.hf import HFBackend
from draftwise.batching import Batcher
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.engine import Engine
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig
from tiny_qwen2 import MAX_POSITIONS, VOCAB, perturbed, tiny_qwen2


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # see test_hf_backend.py
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def target_model():
    return tiny_qwen2(seed=0)


def reference(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].numpy()


def test_one_padded_forward_equals_each_sequence_alone(target_model):
    rng = np.random.default_rng(1)
    backend = HFBackend.from_model(target_model, slots=4, n_ctx=MAX_POSITIONS)
    seqs = [backend.sequence(i) for i in range(4)]
    assert backend.num_slots == 4 and seqs[0] is backend
    contexts = [list(rng.integers(0, VOCAB, size=n)) for n in (9, 3, 0, 14)]
    for seq, ids in zip(seqs, contexts):
        if ids:
            seq.prefill(ids)
    # different past lengths, row counts and logit counts, a prefill-only item; last, a prompt
    # chunk that would pad the others by 3 x 79 rows, so it runs in a forward of its own
    sizes = ((5, 1, 7, 2), (1, 6, 1, 3), (4, 4, 1, 1), (80, 1, 1, 2))
    logits = ((5, 1, 0, 2), (1, 6, 1, 0), (4, 2, 1, 1), (0, 1, 1, 2))
    for step, (sizes_now, wanted) in enumerate(zip(sizes, logits)):
        new = [list(rng.integers(0, VOCAB, size=n)) for n in sizes_now]
        forwards = backend.num_forwards
        out = backend.extend_batch([(seq, ids, n) for seq, ids, n in zip(seqs, new, wanted)])
        for i, (seq, ids, n) in enumerate(zip(seqs, new, wanted)):
            contexts[i] = contexts[i] + ids
            assert out[i].shape == (n, VOCAB)
            if n:
                np.testing.assert_allclose(out[i], reference(target_model, contexts[i])[-n:], atol=1e-10)
            assert seq.cached_ids == contexts[i]
        assert backend.num_forwards - forwards == (2 if step == 3 else 1)
    assert backend.num_batches == 4
    # each cache is its own: truncating one leaves the others, and each continues exactly
    seqs[1].truncate(4)
    contexts[1] = contexts[1][:4]
    for seq, ctx in zip(seqs, contexts):
        np.testing.assert_allclose(seq.extend([7]), reference(target_model, ctx + [7])[-1:], atol=1e-10)


def test_a_failed_batched_forward_leaves_every_cache_as_it_was(target_model, monkeypatch):
    backend = HFBackend.from_model(target_model, slots=2, n_ctx=MAX_POSITIONS)
    a, b = backend.sequence(0), backend.sequence(1)
    a.prefill([1, 2, 3])
    b.prefill([4, 5])
    with pytest.raises(BackendError, match="outside the vocabulary"):
        backend.extend_batch([(a, [6], 1), (b, [VOCAB + 5], 1)])
    assert a.cached_ids == [1, 2, 3] and b.cached_ids == [4, 5]
    other = HFBackend.from_model(target_model, slots=2, n_ctx=MAX_POSITIONS)
    with pytest.raises(BackendError, match="not a sequence of"):
        backend.extend_batch([(a, [6], 1), (other.sequence(1), [7], 1)])
    with pytest.raises(BackendError, match="twice"):
        backend.extend_batch([(b, [6], 1), (b, [7], 1)])

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(target_model, "forward", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        backend.extend_batch([(a, [6], 1), (b, [7, 8], 2)])
    assert a.cached_ids == [1, 2, 3] and b.cached_ids == [4, 5]
    with pytest.raises(ConfigError, match="slots must be >= 1"):
        HFBackend.from_model(target_model, slots=0, n_ctx=MAX_POSITIONS)


PROMPTS = [[116, 257, 32, 99, 97, 116, 44, 258, 32], [5, 6, 7], [9, 9, 9, 9, 9, 9, 9], [2, 4, 6, 8, 2, 4, 6, 8, 2]]
REQUESTS = [  # (prompt, max_tokens, speculation, drafters)
    (PROMPTS[0], 20, SpeculationConfig(policy="fixed", max_draft_tokens=4), ["ngram"]),
    (PROMPTS[1], 14, SpeculationConfig(policy="fixed", max_draft_tokens=3), ["draft"]),
    (PROMPTS[2], 17, SpeculationConfig(enabled=False), None),
    (PROMPTS[3], 22, SpeculationConfig(policy="fixed", max_draft_tokens=5), ["ngram", "draft"]),
    (PROMPTS[0][:4], 9, SpeculationConfig(policy="fixed", max_draft_tokens=2), ["draft"]),
]


def make_engine(target_model, slots: int) -> Engine:
    target = HFBackend.from_model(target_model, name="target", slots=slots, n_ctx=MAX_POSITIONS)
    draft = HFBackend.from_model(perturbed(target_model, noise=0.004), name="draft", slots=slots, n_ctx=MAX_POSITIONS)
    return Engine(target, [ModelDrafter(draft, name="draft"), NgramDrafter(1, 3)])


def test_batched_greedy_equals_single_request(target_model):
    single = make_engine(target_model, 1)
    expected = [
        single.generate(
            prompt_ids=p, sampling=SamplingParams(max_tokens=n, ignore_eos=True), speculation=s, drafters=d
        ).token_ids
        for p, n, s, d in REQUESTS
    ]
    engine = make_engine(target_model, 3)
    batcher = Batcher(engine, prefill_chunk=4)
    results = batcher.run(
        [
            engine.stream(
                prompt_ids=p, sampling=SamplingParams(max_tokens=n, ignore_eos=True), speculation=s, drafters=d
            )
            for p, n, s, d in REQUESTS
        ]
    )  # 5 through 3 slots
    assert [r.token_ids for r in results] == expected
    assert engine.target.num_batches > 0 and sum(r.stats.num_drafted for r in results) > 0
    assert batcher.num_free == 3
