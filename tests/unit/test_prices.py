"""Prices from the run's own forwards (policy/prices.py, policy/cost.TargetTime): they converge on
what many-row forwards cost, ignore one disturbed forward, are kept beside the cached curve for the
host's next run, and the replay can price at them."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from draftwise.backends.toy import ToyBackend
from draftwise.bench.suites.prompts import Prompt
from draftwise.calibrate import CostCurve, cache_file
from draftwise.cli import main
from draftwise.policy.cost import SAVE_EVERY, TargetTime
from draftwise.policy.prices import (
    CLIP,
    FULL_AT,
    MIN_SEEN,
    RUN_WEIGHT,
    CorrectedCurve,
    PriceBook,
    context_bucket,
    prices_file,
    shape_bucket,
)

CODE = "def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n" * 3
CURVE = CostCurve(((1, 30.0), (4, 90.0), (16, 250.0), (64, 800.0)), context_len=256, growth=(2.0, 1.0), growth_one=4.0)


def live_run(time_model: TargetTime, num_steps: int, *, dearer: float = 1.12, seed: int = 0) -> None:
    """A run whose plain steps cost what the curve says and whose 33-64-row forwards cost `dearer`
    times it, each forward with 3% timing noise, alternating as a copying answer does."""
    rng = random.Random(seed)
    for i in range(num_steps):
        context = 600 + 10 * i
        if i % 2:
            rows = rng.choice((40, 49, 57, 65 - 1))
            time_model.observe(rows, dearer * CURVE.ms(rows, context) * rng.uniform(0.97, 1.03), context)
        else:
            time_model.observe(1, CURVE.ms(1, context) * rng.uniform(0.97, 1.03), context)


def test_buckets():
    assert [shape_bucket(n) for n in (1, 2, 3, 4, 5, 17, 32, 33, 64, 65)] == [1, 2, 4, 4, 8, 32, 32, 64, 64, 128]
    assert [context_bucket(c) for c in (None, 0, 300, 1024, 1025, 1500, 4000, 9000)] == [
        1024,
        1024,
        1024,
        1024,
        2048,
        2048,
        4096,
        16384,
    ]


def test_the_prices_converge_within_a_few_dozen_steps_on_forwards_12_percent_dearer():
    time_model = TargetTime(curve=CURVE)
    assert time_model.ms(49, 800) == pytest.approx(CURVE.ms(49, 800))
    live_run(time_model, 36)  # 18 many-row forwards
    assert time_model.shape(49, 800) == pytest.approx(1.12, abs=0.03)
    assert time_model.ms(49, 800) / CURVE.ms(49, 800) == pytest.approx(1.12, abs=0.03)
    assert time_model.shape(1, 800) == 1.0 and time_model.load.value == pytest.approx(1.0, abs=0.03)
    # Sizes of the same bucket share the price; other buckets keep the curve's.
    assert time_model.shape(33, 800) == time_model.shape(64, 800)
    assert time_model.shape(16, 800) == 1.0
    # A context not yet seen takes the same rows' price from the contexts that were.
    assert time_model.shape(49, 3000) == pytest.approx(1.12, abs=0.03)


def test_one_disturbed_forward_moves_neither_the_price_nor_much_the_load():
    time_model = TargetTime(curve=CURVE)
    live_run(time_model, 60)
    price, load = time_model.shape(49, 1200), time_model.load.value
    time_model.observe(49, 4 * CURVE.ms(49, 1200), 1200)  # a neighbour's burst: 4x slow
    assert time_model.shape(49, 1200) == pytest.approx(price, abs=0.01)
    assert time_model.load.value <= 1.06 * load
    time_model.observe(1, 5 * CURVE.ms(1, 1200), 1200)
    assert time_model.load.value <= 1.06 * 1.06 * load
    # The old smoothing moved a shape by alpha x (ratio - 1) per forward: the median does not move.
    book = PriceBook()
    for _ in range(FULL_AT):
        book.observe(40, 500, 1.1)
    book.observe(40, 500, 100.0)  # clipped, and outvoted
    assert book.factor(40, 500) == pytest.approx(1.1) and max(book.seen[(64, 1024)]) == CLIP[1]


def test_a_bucket_learns_its_price_from_min_seen_forwards_and_in_full_at_full_at():
    book = PriceBook({(64, 1024): 1.2})
    for _ in range(MIN_SEEN - 1):
        book.observe(50, 300, 0.9)
        assert book.factor(50, 300) == 1.2 and book.knows(50, 300)  # the prior still
    for seen in range(MIN_SEEN, FULL_AT + 1):
        book.observe(50, 300, 0.9)
        assert book.factor(50, 300) == pytest.approx(1.2 - 0.3 * seen / FULL_AT)
    assert book.factor(50, 2000) == pytest.approx(0.9)  # no prior there: the same rows' price
    fresh = PriceBook()
    for _ in range(FULL_AT - 1):
        fresh.observe(8, 300, 1.3)
    assert not fresh.knows(8, 300) and fresh.factor(8, 300) > 1.2 and fresh.factor(8, 5000) == 1.0
    fresh.observe(8, 300, 1.3)
    assert fresh.knows(8, 300) and fresh.factor(8, 5000) == pytest.approx(1.3)


def test_the_prices_persist_beside_the_cached_curve_and_start_the_next_run(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = ToyBackend()
    path = prices_file(cache_file(target))
    assert path.parent == cache_file(target).parent and path.name.endswith(".prices.json")
    first = TargetTime(target, CURVE)
    live_run(first, 2 * SAVE_EVERY)  # SAVE_EVERY many-row forwards: saved once
    saved = json.loads(path.read_text())
    learnt = first.shape(49, 800)
    assert learnt == pytest.approx(1.12, abs=0.03)
    # Saved a third of the way from where the run started (the curve's 1) to what it learnt.
    assert saved["version"] == 1 and saved["factors"]["64:1024"] == pytest.approx(
        1 + RUN_WEIGHT * (learnt - 1), abs=1e-3
    )
    # The next run on this host starts there, before it has observed anything.
    second = TargetTime(target, CURVE)
    start = second.shape(49, 800)
    assert start == pytest.approx(saved["factors"]["64:1024"], abs=1e-3) and 1.02 < start < 1.06
    assert second.ms(49, 800) == pytest.approx(start * CURVE.ms(49, 800))
    # ... and follows its own forwards from there: this run's are as calibrated.
    live_run(second, 40, dearer=1.0, seed=1)
    assert second.shape(49, 800) == pytest.approx(1.0, abs=0.03)
    # Runs average: a third run that meets 1.12 again saves a third of the way from its own start.
    prior = json.loads(path.read_text())["factors"]["64:1024"]
    third = TargetTime(target, CURVE)
    live_run(third, 2 * SAVE_EVERY, seed=2)
    again_saved = json.loads(path.read_text())["factors"]["64:1024"]
    assert again_saved == pytest.approx(prior + RUN_WEIGHT * (third.shape(49, 800) - prior), abs=0.01)
    assert prior < again_saved < third.shape(49, 800)
    # A curve measured again is not corrected by the prices of the old one.
    again = CostCurve(((1, 31.0), (64, 820.0)), context_len=256)
    assert TargetTime(target, again).shape(49, 800) == 1.0
    # Without a target (a curve given: a replay, a test) nothing is kept.
    live_run(TargetTime(curve=CURVE), 2 * SAVE_EVERY, dearer=1.3)
    assert [p.name for p in path.parent.glob("*.prices.json")] == [path.name]
    assert json.loads(path.read_text())["factors"]["64:1024"] < 1.2


def test_the_corrected_curve_prices_many_rows_at_the_book():
    book = PriceBook({(64, 1024): 1.12, (64, 2048): 1.2})
    corrected = CorrectedCurve.of(CURVE, book)
    assert corrected.ms(1, 800) == CURVE.ms(1, 800)
    assert corrected.ms(49, 800) == pytest.approx(1.12 * CURVE.ms(49, 800))
    assert corrected.ms(49, 1800) == pytest.approx(1.2 * CURVE.ms(49, 1800))
    assert corrected.ms(16, 800) == CURVE.ms(16, 800)


def test_cli_replay_at_the_corrected_prices(tiny_gguf_dir, tmp_path):
    prompts = tmp_path / "dev.jsonl"
    prompts.write_text(json.dumps(Prompt(1, "edit", ("Repeat:\n" + CODE,), reference=CODE).to_dict()) + "\n")
    curve_path = tmp_path / "calibration.json"
    curve = CostCurve(((1, 30.0), (64, 200.0)))
    curve_path.write_text(json.dumps(curve.to_dict()))
    args = ["replay", "--prompts", str(prompts), "--target", str(tiny_gguf_dir / "target.gguf"), "--free-lookups"]
    args += ["--drafters", "ngram", "--curve", str(curve_path), "--oracle"]
    missing = CliRunner().invoke(main, [*args, "--prices", "corrected"])
    assert missing.exit_code == 2 and "prices.json" in missing.output
    book = PriceBook({(b, 1024): 1.5 for b in (2, 4, 8, 16, 32, 64, 128)})
    book.save(prices_file(curve_path), curve)
    calibrated = CliRunner().invoke(main, [*args, "--json"])
    corrected = CliRunner().invoke(main, [*args, "--json", "--prices", "corrected"])
    assert calibrated.exit_code == 0 and corrected.exit_code == 0, corrected.output
    at_curve, at_book = (json.loads(r.output)["all"]["ngram"] for r in (calibrated, corrected))
    assert at_book["oracle_speedup"] < at_curve["oracle_speedup"]  # drafting rows cost 1.5x there
    table = CliRunner().invoke(main, [*args, "--prices", "corrected"])
    assert table.exit_code == 0 and "correctedbythehost'sruns" in "".join(table.output.split())
    PriceBook({(64, 1024): 1.5}).save(prices_file(curve_path), CostCurve(((1, 31.0), (64, 200.0))))
    stale = CliRunner().invoke(main, [*args, "--prices", "corrected"])
    assert stale.exit_code == 2 and "calibrated again" in stale.output
