"""The calibration's order of contexts: up, then down again, so a burst of load over one
context's rounds is not fitted as growth with context (calibrate.measure_grid)."""

from __future__ import annotations

import time

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
        slow["on"] = done == 1  # the second round (the longer context's first) runs slowed down

    curve = measure_grid(backend, (1, 4), contexts=(16, 48), repeats=2, progress=progress)
    assert order == [0, 16, 48, 48, 16]  # cached before each report: up to 48, then back to 16
    # The longer context's fastest round is its second, timed after the spell: no growth to speak
    # of (timing 16's rounds, then 48's, put the spell in both of 48's and priced 4 rows there 6x).
    assert curve.ms(4, 48) < 1.5 * curve.ms(4, 16)
    assert curve.timings[48][4] < 1.5 * curve.timings[16][4]
