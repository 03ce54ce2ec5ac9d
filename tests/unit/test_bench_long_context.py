"""Long context and long outputs in the bench: acceptance and speed over the output from the
steps, the report's context buckets and 512-token blocks, the plots, and a toy run's records.
"""

from draftwise.bench.record.timing import acceptance_windows, block_rates, step_windows
from draftwise.bench.reports import long_context
from draftwise.bench.reports.report import render_markdown, write_report
from draftwise.bench.suites.prompts import Prompt
from draftwise.bench.sweep.runner import BenchConfig, run_bench
from tests.unit.test_bench_runner import toy_engine


def test_acceptance_windows_follow_the_steps_over_the_output():
    assert acceptance_windows([(3, 4, 2), (1, 0, 0), (5, 4, 4)], 4) == [0.5, 1.0]
    # A window where no step drafted has no acceptance (a plain stretch), not 0.
    assert acceptance_windows([(1, 0, 0)] * 4 + [(2, 2, 1)], 2) == [None, None, 0.5]
    assert acceptance_windows([], 32) == []


def test_step_windows_place_each_step_where_it_begins():
    assert list(step_windows([(3, 4, 2), (1, 0, 0), (5, 4, 4)], 4)) == [0, 0, 1]
    assert list(step_windows([(4, 3, 3), (1, 0, 0)], 2)) == [0, 2]  # a long step skips a window
    assert list(step_windows([], 4)) == []


def test_block_rates_weigh_windows_by_their_time():
    assert block_rates([10.0, 20.0], 32, 64) == [round(64 / (3.2 + 1.6), 2)]
    # A partial last block and a block with a missing window are unknown.
    assert block_rates([10.0, 10.0, 10.0], 32, 64) == [10.0, None]
    assert block_rates([10.0, None], 32, 64) == [None]


def test_context_buckets_are_powers_of_two_named_by_their_lower_bound():
    assert [long_context.context_bucket(t) for t in (10, 1500, 8192, 17000, 30000)] == [0, 1024, 8192, 16384, 24576]
    assert long_context.bucket_label(16384) == "16k+"
    assert long_context.bucket_label(0) == "<1k"


def _record(method, prompt_tokens, *, turn=0, generated=64, speedup=None, windows=None, steps=None):
    drafted = sum(d for _, d, _ in steps or ())
    return {
        "question_id": 1,
        "category": "long_rag",
        "turn": turn,
        "method": method,
        "policy_name": "none" if method == "baseline" else "auto",
        "k": None,
        "draft_temperature": None,
        "temperature": 0.0,
        "context_tokens": None,
        "error": None,
        "num_prompt_tokens": prompt_tokens,
        "num_generated": generated,
        "num_drafted": drafted,
        "num_accepted": sum(a for _, _, a in steps or ()),
        "acceptance_rate": 0.5 if drafted else 0.0,
        "num_steps": 10,
        "decode_tokens_per_second": 10.0,
        "speedup": speedup,
        "identical_to_baseline": True,
        "cold_prefill_ms": 2000.0 * prompt_tokens / 1000,
        "cold_reused_tokens": 0,
        "prefill_ms": 5.0,
        "decode_ms": 1000.0 * generated / 10.0,
        "verify_ms": 900.0 * generated / 10.0,
        "ttft_ms": 105.0,
        "window_tokens": 32,
        "tokens_per_second_windows": windows or [10.0] * (generated // 32),
        "step_tokens": steps or [],
    }


def test_the_section_groups_by_the_context_read_and_shows_prefill_and_ttft():
    records = [
        _record("baseline", 9000),
        _record("auto", 9000, speedup=1.5, steps=[(3, 4, 2)]),
        _record("baseline", 30000),
        _record("auto", 30000, speedup=1.0),
        _record("auto", 30500, turn=3, speedup=1.2),  # a later turn: no cold prefill of its own
    ]
    # A second prompt on the same context: its cold read took 29,900 tokens from the one before.
    records.append(dict(_record("auto", 30000, speedup=1.1), question_id=2, cold_prefill_ms=300.0))
    records[-1]["cold_reused_tokens"] = 29_900
    rows = {(r[0], r[1]): r for r in long_context.context_rows(records)}
    assert set(rows) == {("8k+", "baseline"), ("8k+", "auto"), ("24k+", "baseline"), ("24k+", "auto")}
    auto_long = rows["24k+", "auto"]
    assert auto_long[2] == 3  # both turns of the first, and the second prompt, read 24k+ tokens
    assert auto_long[4] == "60.0"  # the longest cold prefill: 2 ms a token x 30,000
    assert auto_long[5] == f"{(30_000 + 100) / 60.3:.0f}"  # tokens read (not reused) over the time
    assert auto_long[6] == "60.1"  # + its first step (ttft 105 ms - its own 5 ms of prefill)
    assert auto_long[8] == f"{(1.0 * 1.2 * 1.1) ** (1 / 3):.2f}x"
    unknown = [dict(r, cold_reused_tokens=None) for r in records]  # results made before the field
    assert {r[5] for r in long_context.context_rows(unknown)} == {"-"}
    text = "\n".join(long_context.long_context_section(records, {}))
    assert "## Long context" in text and "24k+" in text
    # Short runs get no such section.
    assert long_context.long_context_section([_record("auto", 900)], {}) == []


def test_long_outputs_show_speed_per_512_tokens_and_how_it_holds():
    windows = [20.0] * 16 + [16.0] * 16 + [18.0] * 16  # three 512-token blocks
    records = [_record("baseline", 500, generated=1536, windows=windows)]
    (row,) = long_context.output_rows(records)
    assert row[3] == 1536
    assert row[4:9] == ("20.0", "18.0", "0.90", "0.80", "-")  # no calibration: nothing expected
    # With the run's curve (30 ms a row, 40 for two, at 256 tokens; +10 ms + 5 ms a row per 1,000
    # tokens of context), the first block's steps are priced at their context and 1,024 tokens
    # later (the last block of three): one-row steps of plain decoding, two-row steps of a method.
    meta = {
        "calibration": {"target": {"1": 30.0, "2": 40.0}},
        "calibration_context": {"target": {"context_len": 256, "growth": [10.0, 5.0]}},
    }
    plain = dict(records[0], num_prompt_tokens=256, step_tokens=[(1, 0, 0)] * 1536)
    plain["step_times"] = [(1, 256 + i, 30.0, 30.0) for i in range(1536)]
    first = [30 + (i / 1000) * 15 for i in range(512)]
    later = [30 + ((i + 1024) / 1000) * 15 for i in range(512)]
    (row,) = long_context.output_rows([plain], meta)
    assert row[8] == f"{sum(first) / sum(later):.2f}"
    drafting = dict(plain, step_tokens=[(2, 1, 1)] * 768, step_times=[(2, 256 + 2 * i, 40.0, 40.0) for i in range(768)])
    first = [40 + (2 * i / 1000) * 20 for i in range(256)]
    later = [40 + ((2 * i + 1024) / 1000) * 20 for i in range(256)]
    (row,) = long_context.output_rows([drafting], meta)
    assert row[8] == f"{sum(first) / sum(later):.2f}"
    # Besides the growth: tokens per step and the forwards against the curve, first and last block.
    assert row[9] == "2.0 / 2.0"
    assert row[10] == f"{sum(40.0 for _ in first) / sum(first):.2f} / {256 * 40.0 / sum(later):.2f}"
    (row,) = long_context.output_rows(records)
    assert row[9:11] == ("-", "-")  # no steps recorded: nothing to split


def test_block_steps_split_drafting_from_the_machine():
    """A method that drafts less late in an answer, on a machine that slows down: block_steps tells
    the two apart (tokens per step; measured forward time over the curve's price)."""
    meta = {"calibration": {"target": {"1": 30.0, "4": 60.0}}}
    curve = long_context.target_curve(meta)
    early = [(4, 100 + 4 * i, 54.0, 55.0) for i in range(128)]  # 4 rows, 4 tokens a step: 512 tokens
    late = [(1, 612 + i, 33.0, 34.0) for i in range(512)]  # plain steps, 10% above the curve
    record = {
        "num_generated": 1024,
        "step_times": early + late,
        "step_tokens": [(4, 3, 3)] * 128 + [(1, 0, 0)] * 512,
    }
    assert long_context.block_steps(record, curve) == [(4.0, 0.9), (1.0, 33.0 / 30.0)]
    assert long_context.block_steps(record, None) == [(4.0, None), (1.0, None)]
    assert long_context.block_steps({"num_generated": 100}, curve) == []


def test_the_report_draws_the_long_context_plots(tmp_path):
    windows = [20.0] * 32
    steps = [(4, 4, 3)] * 256
    records = [
        _record("baseline", 9000, generated=1024, windows=windows),
        _record("auto", 9000, generated=1024, windows=windows, speedup=1.1, steps=steps),
        _record("auto", 20000, generated=64, speedup=0.99, steps=[(2, 2, 1)]),
    ]
    results = {"format": "draftwise-bench/1", "config": {}, "meta": {}, "complete": True, "records": records}
    write_report(results, tmp_path)
    assert (tmp_path / "long_context.png").stat().st_size > 1000
    assert (tmp_path / "long_outputs.png").stat().st_size > 1000
    assert "### Long outputs" in render_markdown(results)
    page = (tmp_path / "report.html").read_text()
    assert "<h2>Long context</h2>" in page and "<h3>Long outputs</h3>" in page


def test_a_run_records_acceptance_over_the_output_ttft_and_a_prompts_own_answer_length(tmp_path):
    prompts = [
        Prompt(21, "code", ("def add(a, b): return a + b. now write sub",)),
        Prompt(22, "chat", ("tell me a story about a cat",), max_tokens=12),
    ]
    results = run_bench(toy_engine(), prompts, BenchConfig(methods=("baseline", "ngram"), max_tokens=40), tmp_path)
    for r in results["records"]:
        assert r["error"] is None
        assert r["ttft_ms"] is not None and r["ttft_ms"] > 0
        assert sum(c for c, _, _ in r["step_tokens"]) >= r["num_generated"]
        if r["method"] == "baseline":
            assert all(a is None for a in r["acceptance_windows"])
        elif r["num_drafted"]:
            assert any(a is not None for a in r["acceptance_windows"])
    by_question = {r["question_id"]: r for r in results["records"]}
    assert by_question[21]["max_tokens"] == 40
    assert by_question[22]["max_tokens"] == 12
    assert by_question[22]["num_generated"] <= 12
