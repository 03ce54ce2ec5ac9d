"""The calibrated cost curve: its cache (reused, invalidated, measured again when stale or timed
over a shorter grid), its fit over contexts (one row apart from many), and its prices per size."""

import json
import time

import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.calibrate import STALE_RATIO, CostCurve, cache_file, load_or_measure


def test_calibration_cache_reused_and_invalidated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    backend = ToyBackend(ToyModel(vocab_size=8, seed=1), name="m1")
    first = load_or_measure(backend, max_n=4)
    path = cache_file(backend)
    data = json.loads(path.read_text())
    # Mark the cached file (a cost below anything a probe measures, so it is not stale): a reuse
    # returns the mark.
    data["points"][0][1] = 1e-9
    path.write_text(json.dumps(data))
    assert load_or_measure(backend, max_n=4).ms(1) == 1e-9
    other_model = ToyBackend(ToyModel(vocab_size=8, seed=2), name="m1")
    assert cache_file(other_model) != path
    backend.n_threads = 4  # another thread count: another cache entry
    assert cache_file(backend) != path
    assert load_or_measure(backend, max_n=4).ms(1) != 1e-9
    assert first.max_n == 4


def test_a_cached_curve_timed_on_a_loaded_host_is_measured_again(tmp_path, monkeypatch):
    """A curve whose single-token cost is far above a fresh probe's (it was measured while the host
    was busy) would make the policy misprice every draft: it is measured again and rewritten."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    delay = {"s": 0.0}
    model = ToyModel(vocab_size=8, seed=1)

    def logits(context):
        time.sleep(delay["s"])
        return model.logits(context)

    backend = ToyBackend(logits_fn=logits, vocab_size=8, name="slowable")
    delay["s"] = 0.02  # the host is busy while the curve is measured: 20 ms per forward
    busy = load_or_measure(backend, max_n=4)
    assert busy.ms(1) >= 20.0
    delay["s"] = 0.0  # quiet again: the cached curve is stale and measured again
    quiet = load_or_measure(backend, max_n=4)
    assert quiet.ms(1) < busy.ms(1) / STALE_RATIO
    assert json.loads(cache_file(backend).read_text())["points"][0][1] == quiet.ms(1)
    delay["s"] = 0.02  # busy now: a probe slowed by load keeps the quiet curve
    assert load_or_measure(backend, max_n=4).ms(1) == quiet.ms(1)


def test_cost_curve_keeps_non_monotonic_points():
    curve = CostCurve(((1, 30.0), (8, 224.0), (16, 165.0)))
    assert curve.ms(16) == 165.0 < curve.ms(8)
    assert curve.ms(12) == pytest.approx(194.5)


def test_the_grid_fit_recovers_how_cost_grows_with_context():
    """ms(n, c) = W(n) + (c - c0) / 1000 * (a + b n): timings on that surface, each off by up to
    +-8% (a shared host), give back W within the noise and a, b close; the surface, not one
    context's timings, prices a forward at any context."""
    import random

    from draftwise.calibrate import fit_grid

    rng = random.Random(3)
    sizes = (1, 2, 4, 8, 16, 32, 64)
    true_w = {n: 30.0 + 11.0 * (n - 1) for n in sizes}
    times = {
        c: {n: (true_w[n] + (c - 256) / 1000 * (6.0 + 1.5 * n)) * rng.uniform(0.92, 1.08) for n in sizes}
        for c in (256, 1024, 2048, 4096)
    }
    curve = fit_grid(times)
    assert curve.context_len == 256
    assert curve.growth[0] == pytest.approx(6.0, abs=4.0) and curve.growth[1] == pytest.approx(1.5, rel=0.25)
    for n in sizes:
        assert curve.ms(n) == pytest.approx(true_w[n], rel=0.08)
        assert curve.ms(n, 4096) == pytest.approx(true_w[n] + 3.84 * (6.0 + 1.5 * n), rel=0.08)
    assert curve.ms(1, None) == curve.ms(1)  # no context: the curve as timed
    # Exact data, exact answer; a cost that falls with context is clamped to none.
    exact = fit_grid({256: {1: 30.0, 4: 60.0, 8: 100.0}, 1256: {1: 40.0, 4: 76.0, 8: 124.0}})
    assert exact.growth == pytest.approx((8.0, 2.0)) and exact.ms(4, 2256) == pytest.approx(92.0)
    assert exact.growth_one == pytest.approx(10.0)
    falling = fit_grid({256: {1: 30.0, 4: 60.0}, 1256: {1: 29.0, 4: 58.0}})
    assert falling.growth == (0.0, 0.0) and falling.growth_one == 0.0 and not falling.grows
    again = CostCurve.from_dict(json.loads(json.dumps(exact.to_dict())))
    assert again == exact and again.timings == exact.timings  # the timings travel with the curve


def test_one_row_grows_with_context_apart_from_many():
    """llama.cpp attends from one row with other kernels than from many: at 8k-28k tokens one line
    through every size priced one row 10-14% high and 2-65 rows 1-5% low (docs/long-context.md).
    Timings where one row grows by 5 ms per 1,000 tokens and n rows by 4 + 2 n: the fit gives each
    its own, and prices a 5-row verification against a plain step at 28k as the timings do."""
    from draftwise.calibrate import fit_grid

    sizes = (1, 2, 4, 8, 16, 32, 64)

    def true_ms(n, c):  # W(n) linear in n, so the curve's interpolation between sizes is exact
        return 70.0 + 12.0 * (n - 1) + (c - 256) / 1000 * (5.0 if n == 1 else 4.0 + 2.0 * n)

    curve = fit_grid({c: {n: true_ms(n, c) for n in sizes} for c in (256, 1024, 2048, 8192)})
    assert curve.growth_one == pytest.approx(5.0) and curve.growth == pytest.approx((4.0, 2.0))
    for n in (1, 5, 33):
        assert curve.ms(n, 28_000) == pytest.approx(true_ms(n, 28_000))
    ratio = curve.ms(5, 28_000) / curve.ms(1, 28_000)
    one_line = CostCurve(curve.points, 256, growth=(4.0 * 0.7, 2.0 * 0.7))  # a joint fit's compromise
    assert ratio > one_line.ms(5, 28_000) / one_line.ms(1, 28_000)
    # A curve from before the split (no growth_one) prices one row on its line, as it did.
    old = CostCurve.from_dict({"points": [[1, 30.0], [4, 60.0]], "context_len": 256, "growth": [8.0, 2.0]})
    assert old.growth_one is None and old.ms(1, 1256) == pytest.approx(40.0) and old.grows
    assert "one row" in curve.growth_text() and "one row" not in old.growth_text()


def test_a_curve_prices_every_size_from_its_table_as_from_its_points():
    from draftwise.calibrate import TABLE_ROWS, ScaledCurve

    points = ((1, 26.0), (2, 46.0), (4, 70.0), (16, 140.0), (64, 464.0))
    curve = CostCurve(points, 256, growth=(1.4, 0.81), growth_one=2.8)
    scaled = ScaledCurve(points, 256, growth=(1.4, 0.81), growth_one=2.8, factors=((1, 0.94), (48, 1.18)))
    for c in (curve, scaled):
        for n in (0, 1, 2, 3, 17, 64, 65, TABLE_ROWS, TABLE_ROWS + 1, 400):
            for context in (None, 100, 256, 9000):
                base = c._base(n) if n > 0 else 0.0
                if context is not None and n > 0:
                    base = max(base + (context - 256) / 1000 * c.growth_at(n), 0.5 * c._base(n))
                factor = c.factor(n) if isinstance(c, ScaledCurve) and n > 0 else 1.0
                assert c.ms(n, context) == pytest.approx(base * factor, rel=1e-12)


def test_calibration_times_every_context_the_window_holds(tmp_path, monkeypatch):
    """A backend whose forward grows with the context it attends to: the calibrated curve grows
    with context too, and only contexts with room for the largest forward are timed."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = ToyModel(vocab_size=8, seed=1)

    def logits(context):
        time.sleep(0.002 + 0.000002 * len(context))  # 2 ms per row + 2 ms per 1,000 tokens
        return model.logits(context)

    seen = []
    backend = ToyBackend(logits_fn=logits, vocab_size=8, name="grows", n_ctx=1500)
    original = backend.prefill
    backend.prefill = lambda ids: (seen.append(backend.num_cached + len(ids)), original(ids))[1]
    curve = load_or_measure(backend, max_n=4)
    assert max(seen) == 1024  # 2,048 does not fit a window of 1,500
    assert [s for s in seen if s > 1] == [256, 1024]  # the context is read once, not per round
    assert curve.context_len == 256 and curve.growth[1] > 0.5  # ~2 ms per row per 1,000 tokens
    assert curve.ms(4, 2048) > curve.ms(4) + 4 * 0.5 * 1.792
    assert json.loads(cache_file(backend).read_text())["growth"] == list(curve.growth)


def test_a_long_window_times_8k_and_a_curve_from_a_shorter_grid_is_measured_again(tmp_path, monkeypatch):
    """In a window that holds 8,192 tokens and a forward, the grid reaches 8,192 (the growth is
    then read over a range near the contexts such a window serves), the cache says so, and a
    cached curve timed only up to 2,048 (an older grid) is measured again there."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    seen = []
    backend = ToyBackend(ToyModel(vocab_size=8, seed=1), name="long", n_ctx=9000)
    original = backend.prefill
    backend.prefill = lambda ids: (seen.append(backend.num_cached + len(ids)), original(ids))[1]
    load_or_measure(backend, max_n=4)
    assert [s for s in seen if s > 1] == [256, 1024, 2048, 8192]
    path = cache_file(backend)
    data = json.loads(path.read_text())
    assert data["longest_context"] == 8192
    data["points"][0][1] = 1e-9  # a mark (below any probe, so never stale)
    path.write_text(json.dumps(data))
    assert load_or_measure(backend, max_n=4).ms(1) == 1e-9  # reused
    del data["longest_context"]  # as an older grid wrote it
    path.write_text(json.dumps(data))
    assert load_or_measure(backend, max_n=4).ms(1) != 1e-9  # measured again
    # A window too small for 8k keeps using an older curve.
    small = ToyBackend(ToyModel(vocab_size=8, seed=1), name="short", n_ctx=4096)
    load_or_measure(small, max_n=4)
    old = json.loads(cache_file(small).read_text())
    del old["longest_context"]
    old["points"][0][1] = 1e-9
    cache_file(small).write_text(json.dumps(old))
    assert load_or_measure(small, max_n=4).ms(1) == 1e-9
