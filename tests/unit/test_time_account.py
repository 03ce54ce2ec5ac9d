"""The time account: a request's decode time split by step phase sums to its decode time, each
step is recorded with its rows and context, the report shows the split per method, and the
live-against-replay split adds up exactly (toy backend, synthetic records)."""

import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.bench.offline.account import run_prices, split
from draftwise.bench.reports.report import ACCOUNT_PARTS, render_markdown, time_account_rows
from draftwise.calibrate import CostCurve
from draftwise.constraints import Constraint
from draftwise.drafters import NgramDrafter
from draftwise.engine import Engine
from draftwise.types import SamplingParams, SpeculationConfig

TARGET = ToyModel(vocab_size=24, order=2, seed=3, sharpness=3.0)
PHASES = {"force", "plan", "draft", "forward", "verify", "commit", "masks", "loop", "other"}


@pytest.mark.parametrize("constraint", [None, Constraint.regex("[a-h]{0,80}")])
def test_the_parts_sum_to_the_decode_time_and_every_step_is_recorded(constraint):
    engine = Engine(ToyBackend(TARGET), [NgramDrafter(1, 3)])
    result = engine.generate(
        prompt_ids=[1, 2, 3, 1, 2, 3],
        sampling=SamplingParams(max_tokens=60, ignore_eos=True, constraint=constraint),
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4),
    )
    stats = result.stats
    assert set(stats.time_ms) == PHASES
    assert sum(stats.time_ms.values()) == pytest.approx(stats.decode_ms)
    assert all(ms >= 0 for phase, ms in stats.time_ms.items())
    assert (stats.time_ms["masks"] > 0) == (constraint is not None)
    assert len(stats.step_times) == stats.num_steps
    # A request alone: each step's forward holds its uncached last token and its draft.
    rows = [r for r, _, _, _ in stats.step_times]
    assert sum(rows) == stats.num_steps + stats.num_drafted + stats.num_forced_tokens
    contexts = [c for _, c, _, _ in stats.step_times]
    assert contexts == sorted(contexts) and contexts[0] == 6
    assert all(total >= forward for _, _, forward, total in stats.step_times)


def test_the_live_split_adds_up_and_finds_a_context_dependent_forward():
    curve = CostCurve(((1, 10.0), (8, 24.0)))
    # Short-context steps run as the curve says, long-context ones at twice it (+ 1 ms noise on one).
    steps = [
        (1, 100, 10.0, 12.0),
        (5, 100, curve.ms(5), curve.ms(5) + 3.0),
        (1, 3000, 20.0, 22.0),
        (1, 3000, 21.0, 23.0),
        (1, 3000, 20.0, 22.0),
    ]
    decode = sum(total for *_, total in steps) + 4.0  # 4 ms between steps
    record = {"method": "auto", "decode_ms": decode, "step_times": steps}
    result, table = split([record], curve, "auto")
    replayed = sum(curve.ms(rows) for rows, *_ in steps)
    assert result.replayed_ms == pytest.approx(replayed)
    assert result.curve_error_ms == pytest.approx(3 * 10.0)  # the long-context bucket's median: 2x the curve
    assert result.noise_ms == pytest.approx(1.0)
    assert result.overhead_ms == pytest.approx(2 + 3 + 2 + 2 + 2)
    assert result.other_ms == pytest.approx(4.0)
    assert (
        result.replayed_ms + result.curve_error_ms + result.noise_ms + result.overhead_ms + result.other_ms
    ) == pytest.approx(decode)
    assert [(rows, ctx, n) for rows, ctx, n, *_ in table] == [(1, 0, 1), (1, 2048, 3), (5, 0, 1)]
    # A curve calibrated over context (10 ms per row per 1,000 tokens past 100) prices those
    # long-context steps at their 2x: no cost-curve error is left.
    grown = CostCurve(curve.points, context_len=100, growth=(0.0, 10.0 / 2.9))
    result, _ = split([record], grown, "auto")
    assert result.curve_error_ms == pytest.approx(0.0, abs=1e-9)
    assert result.replayed_ms == pytest.approx(replayed + 3 * 10.0)


def test_the_report_shows_where_the_decode_time_goes():
    records = [
        {
            "method": m,
            "temperature": 0.0,
            "decode_ms": 100.0,
            "num_steps": 10,
            "error": None,
            "time_ms": {"forward": f, "plan": 2.0, "draft": 8.0, "loop": 5.0, "other": 100.0 - f - 15.0},
        }
        for m, f in (("baseline", 90.0), ("auto", 70.0))
    ]
    rows = time_account_rows(records)
    assert [r[1] for r in rows] == ["baseline", "auto"]
    auto = dict(zip(("T", "method", *ACCOUNT_PARTS, "accounted", "ms/step"), rows[1]))
    assert auto["forward"] == "70.0%" and auto["draft"] == "10.0%" and auto["accounted"] == "85.0%"
    from tests.unit.test_bench_report import fake_results

    results = fake_results()
    for r in results["records"]:
        if not r.get("error"):
            decode = r["decode_ms"]
            r["time_ms"] = {"forward": 0.8 * decode, "loop": 0.1 * decode, "other": 0.1 * decode}
    report = render_markdown(results)
    assert "## Where the decode time goes" in report and "| 0 | ngram k=4 | 80.0% |" in report


def test_run_prices_scale_the_curve_by_what_the_runs_forwards_took():
    curve = CostCurve(((1, 10.0), (64, 200.0)), context_len=100, growth=(1.0, 0.1), growth_one=2.0)
    # One-row steps at 0.8 of the curve (either method), 20-row ones at 0.9 (one outlier), a bucket
    # of 5-8 rows with too few steps to price.
    plain = [(1, 100 + i, 0.8 * curve.ms(1, 100 + i), 9.0) for i in range(6)]
    drafted = [(20, 200, 0.9 * curve.ms(20, 200), 200.0)] * 5 + [(20, 300, 3.0 * curve.ms(20, 300), 600.0)]
    few = [(6, 200, 2.0 * curve.ms(6, 200), 100.0)] * 4
    results = {
        "records": [
            {"method": "baseline", "decode_ms": 1.0, "step_times": plain},
            {"method": "auto", "decode_ms": 1.0, "step_times": drafted + few},
            {"method": "auto", "error": "boom", "decode_ms": 1.0, "step_times": [(1, 100, 100.0, 100.0)] * 9},
        ]
    }
    priced = run_prices(results, curve)
    assert [n for n, _ in priced.factors] == [1, 20]
    assert [f for _, f in priced.factors] == pytest.approx([0.8, 0.9])
    assert priced.ms(1, 5000) == pytest.approx(0.8 * curve.ms(1, 5000))
    assert priced.ms(64, 5000) == pytest.approx(0.9 * curve.ms(64, 5000))  # held beyond the last bucket
    assert priced.factor(10) == pytest.approx(0.8 + 0.1 * 9 / 19)  # between the buckets' median rows
    assert priced.growth == curve.growth and priced.points == curve.points
    assert run_prices({"records": []}, curve).ms(7, 900) == pytest.approx(curve.ms(7, 900))
