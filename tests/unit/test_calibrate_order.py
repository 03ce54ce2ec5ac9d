"""The calibration's order of contexts: up, then down again, so a burst of load over one
context's rounds is not fitted as growth with context (calibrate.measure_grid)."""

from __future__ import annotations

import time
from dataclasses import replace

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.calibrate import measure_grid


def test_a_slow_spell_over_one_contexts_first_rounds_is_not_growth():
    model = ToyModel(vocab_size=8, seed=1)
    slow = {"on": False}
    order: list[int] = []

    def logits(context):
        time.sleep(0.012 if slow["on"] else 0.002)  # per row: a neighbour triples every forward
        return model.logits(context)

    backend = ToyBackend(logits_fn=logits, vocab_size=8, name="spell")

    def progress(done: int, total: int) -> None:
        order.append(backend.num_cached)
        slow["on"] = done in (2, 3)  # the longer context's rounds on the way up run slowed down

    curve = measure_grid(backend, (1, 4), contexts=(16, 48), repeats=4, progress=progress)
    assert order == [0, 16, 16, 48, 48, 48, 48, 16, 16]  # the cache after each round: up to 48, back to 16
    # The longer context's fastest rounds are on the way down, after the spell: no growth to speak
    # of (timing 16's rounds, then 48's, put the spell in all of 48's and priced 4 rows there 6x).
    assert curve.ms(4, 48) < 1.5 * curve.ms(4, 16)
    assert curve.timings[48][4] < 1.5 * curve.timings[16][4]


def test_a_backend_of_several_sequences_is_calibrated_apart(tmp_path, monkeypatch):
    """Slots or token trees run other kernels (llama.cpp: flash attention) over a shared cache:
    their curve is not the one-sequence context's, and the one-sequence key is unchanged."""
    from draftwise.calibrate import _key, cache_file

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    one, slots = ToyBackend(), ToyBackend(slots=4)
    # As llama.cpp declares them: one sequence (no trees), and four slots.
    one.capabilities = replace(one.capabilities, max_branches=1)
    slots.capabilities = replace(slots.capabilities, max_branches=1)
    assert one.identity == slots.identity and one.n_ctx == slots.n_ctx
    assert cache_file(one) != cache_file(slots)
    assert cache_file(one).stem == _key(one.identity, 0, one.n_ctx)  # as pairing finds a model's curve
    trees = ToyBackend()  # max_branches 16: a tree's forward runs over several sequences too
    assert cache_file(trees) == cache_file(slots)
