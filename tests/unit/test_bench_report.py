"""The bench report from a small fake result set: tables with the right aggregates, PNG plots,
and the CLI's report-only and prompt-file error paths.
"""

import json
import math

import pytest
from click.testing import CliRunner

from draftwise.bench.reports.report import category_rows, geomean, render_markdown, write_report
from draftwise.bench.sweep.runner import FORMAT
from draftwise.cli import main


def record(
    qid,
    category,
    method,
    tps,
    speedup,
    *,
    k=4,
    drafted=0,
    accepted=0,
    steps=10,
    generated=10,
    identical=True,
    temperature=0.0,
    windows=(20.0, 21.0, 19.0, 22.0),
    error=None,
    overhead=0.0,
):
    r = {
        "question_id": qid,
        "category": category,
        "turn": 0,
        "method": method,
        "policy_name": "none" if method == "baseline" else "fixed",
        "k": None if method == "baseline" else k,
        "draft_temperature": None,
        "temperature": temperature,
        "context_tokens": None,
        "memory_overhead_mb": overhead,
        "error": error,
    }
    if error:
        return {**r, "speedup": None, "identical_to_baseline": None}
    return {
        **r,
        "new_tokens": generated,
        "num_generated": generated,
        "num_drafted": drafted,
        "num_accepted": accepted,
        "num_steps": steps,
        "decode_tokens_per_second": tps,
        "speedup": speedup,
        "identical_to_baseline": identical,
        "tokens_per_second_windows": list(windows),
        "window_tokens": 32,
        "position_drafted": [steps, steps] if drafted else [],
        "position_accepted": [accepted // 2, accepted // 2] if drafted else [],
        "decode_ms": 1000 * generated / tps,
        "verify_ms": 900 * generated / tps,
        "policy": {"policy": "auto", "target_cost_ms": {"1": 30.0, "2": 60.0, "4": 100.0}},
    }


def fake_results():
    records = [
        record(1, "code", "baseline", 20.0, 1.0),
        record(1, "code", "ngram", 30.0, 1.5, drafted=40, accepted=30, steps=10, generated=40),
        record(
            1,
            "code",
            "draft",
            10.0,
            0.5,
            drafted=40,
            accepted=20,
            steps=10,
            generated=30,
            identical=False,
            overhead=512.0,
        ),
        record(2, "code", "baseline", 25.0, 1.0),
        record(2, "code", "ngram", 50.0, 2.0, drafted=20, accepted=10, steps=10, generated=20),
        record(2, "code", "draft", 10.0, 0.4, drafted=0, accepted=0, error="RuntimeError: boom", overhead=512.0),
        record(3, "chat", "baseline", 30.0, 1.0),
        record(3, "chat", "ngram", 27.0, 0.9, drafted=10, accepted=1, steps=10, generated=11),
        record(3, "chat", "draft", 15.0, 0.5, drafted=40, accepted=10, steps=10, generated=20, overhead=512.0),
    ]
    return {
        "format": FORMAT,
        "complete": True,
        "records": records,
        "config": {"methods": ["baseline", "ngram", "draft"], "max_tokens": 64, "ks": [4], "repeats": 1},
        "meta": {
            "target": "toy",
            "draft_model": "toy-draft",
            "drafters": ["draft", "ngram"],
            "prompts": "fake",
            "memory": {"draft_overhead_mb": 512.0},
            "calibration": {"target": {"1": 30.0, "4": 100.0, "16": 250.0}},
        },
    }


def test_geomean():
    assert math.isclose(geomean([1.5, 2.0, None, 0.0]), math.sqrt(3.0))
    assert geomean([]) is None


def test_category_table_aggregates():
    rows = {(r[0], r[1]): r for r in category_rows(fake_results()["records"])}
    ngram_code = rows[("code", "ngram k=4")]
    assert ngram_code[2:] == ("2", "40.0", f"{math.sqrt(3.0):.2f}x", "-", "67%", "3.00", "100%", "+0", "0")
    draft_code = rows[("code", "draft k=4")]
    assert draft_code[2:] == ("1", "10.0", "0.50x", "-", "50%", "3.00", "0%", "+512", "1")
    assert rows[("code", "baseline")][4] == "1.00x"
    assert rows[("all", "ngram k=4")][4] == f"{(1.5 * 2.0 * 0.9) ** (1 / 3):.2f}x"
    assert [r[0] for r in category_rows(fake_results()["records"])][-3:] == ["all", "all", "all"]


def test_report_writes_markdown_and_plots(tmp_path):
    path = write_report(fake_results(), tmp_path)
    text = path.read_text()
    assert "| category | method | n | tok/s | speedup | drift-corr. | acceptance |" in text
    assert "| code | ngram k=4 | 2 | 40.0 |" in text
    assert "Overall geometric-mean speedup" in text and "RuntimeError: boom" in text
    assert "late/early" in text
    for name in ("speedup_by_category", "tokens_per_second_over_output", "acceptance_by_position", "cost_curve"):
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"({name}.png)" in text
    assert not (tmp_path / "context_sweep.png").exists()  # only with several context lengths


def test_context_sweep_section_and_plot(tmp_path):
    results = fake_results()
    extra = []
    for r in results["records"]:
        r["context_tokens"] = 256
        extra.append({**r, "context_tokens": 1024, "question_id": r["question_id"]})
    results["records"] += extra
    text = write_report(results, tmp_path).read_text()
    assert "## Context sweep" in text and (tmp_path / "context_sweep.png").exists()
    assert "| 0 | ngram k=4 | 1024 |" in text


def test_incomplete_and_empty_results_still_render():
    assert "run incomplete" in render_markdown({**fake_results(), "complete": False})
    assert render_markdown({"records": []}).startswith("# draftwise bench report")


def test_cli_report_only_rewrites_the_report_and_prints_the_table(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(fake_results()))
    out = CliRunner().invoke(main, ["bench", "--report-only", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "ngram" in out.output and "1.73x" in out.output and (tmp_path / "report.md").exists()


def test_cli_names_file_and_line_of_a_malformed_prompt(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "x", "turns": ["hi"]}\n{"question_id": 2, "category": "x"}\n')
    out = CliRunner().invoke(main, ["bench", "--prompts", str(bad), "--out", str(tmp_path / "o")])
    assert out.exit_code == 2
    assert f"error: {bad}:2: 'turns' must be a non-empty list" in out.output


def test_cli_rejects_unknown_method_before_loading_models(tmp_path):
    out = CliRunner().invoke(main, ["bench", "--methods", "baseline,magic", "--out", str(tmp_path)])
    assert out.exit_code == 2 and "unknown method 'magic'" in out.output


def test_competing_load_counts_other_processes_only():
    """CPU figures injected: our process used 1.5 of the 2 CPU-seconds the machine was busy in 1 s on
    2 CPUs, so others took 0.5 / 2 = 25%; the report warns above 15% only."""
    from collections import namedtuple

    from draftwise.bench.record.timing import CompetingLoad
    from draftwise.bench.reports.report import render_markdown

    Cpu = namedtuple("Cpu", "user system")
    Own = namedtuple("Own", "user system children_user children_system")
    machine, own = iter([Cpu(10.0, 0.0), Cpu(12.0, 0.0)]), iter([Own(1.0, 0.0, 0, 0), Own(2.5, 0.0, 0, 0)])
    probe = CompetingLoad(
        cpu_times=lambda: next(machine), own_times=lambda: next(own), cpus=2, clock=iter([0.0, 1.0]).__next__
    )
    assert probe.share() == pytest.approx(0.25)
    quiet, busy = fake_results(), fake_results()
    for r in quiet["records"]:
        r["other_cpu_share"] = 0.02
    for i, r in enumerate(busy["records"]):
        r["other_cpu_share"] = 0.4 if i == 0 else 0.02
    assert "competed" not in render_markdown(quiet) and "2%–2% of the machine" in render_markdown(quiet)
    assert "competed for the CPU in 1 of 9 runs" in render_markdown(busy)


def test_the_report_states_the_always_right_ceiling_of_its_calibration():
    from draftwise.bench.reports.report import always_right_ceiling

    assert always_right_ceiling({"1": 30, "2": 45, "4": 60}) == (2.0, 3)
    assert always_right_ceiling(None) is None
    speedup, k = always_right_ceiling(fake_results()["meta"]["calibration"]["target"])  # 16 rows cost 250 ms
    assert k == 15 and speedup == pytest.approx(16 * 30 / 250)
    assert f"**{speedup:.2f}x** at k = 15" in render_markdown(fake_results())


def test_the_memory_section_tabulates_each_methods_caches_indexes_and_what_speculation_adds():
    from draftwise.bench.reports.report_sections import memory_rows, memory_section

    mb = 2**20
    results = fake_results()
    results["meta"]["memory"] = {
        "target_overhead_mb": 1800.0,
        "draft_overhead_mb": 512.0,
        "target_weights_mb": 1060.0,
        "draft_weights_mb": 463.0,
    }
    for r in results["records"]:
        if r.get("error"):
            continue
        r.update(rss_mb=2400.0, peak_rss_mb=2500.0, drafters=[] if r["method"] == "baseline" else [r["method"]])
        r["kv_target_bytes"] = {"allocated": 112 * mb, "used": 3 * mb}
        r["drafter_bytes"] = {"ngram": 2 * mb} if r["method"] == "ngram" else {}
        if r["method"] == "draft":
            r["kv_draft_bytes"] = {"allocated": 48 * mb, "used": int(1.25 * mb)}
    rows = {row[0]: row for row in memory_rows(results["records"], results["meta"])}
    assert rows["baseline"] == ("baseline", 3, "2400", "2500", "3.00", "112.00", "-", "0.00", "+0.0%", "+0.0%")
    # (463 + 48) / (1060 + 112) = 43.6%; by RSS, the records' memory_overhead_mb: 512 / 1800 = 28.4%.
    assert rows["draft k=4"][6:] == ("1.25", "0.00", "+43.6% (over +40%)", "+28.4%")
    assert rows["ngram k=4"][6:] == ("-", "2.00", f"+{2 / 1172:.1%}", f"+{2 / 1800:.1%}")
    text = "\n".join(memory_section(results["records"], results["meta"]))
    assert "| target_weights_mb | 1060.0 |" in text  # the probes' table stays
    assert "| draft k=4 | 2 | 2400 | 2500 | 3.00 | 112.00 | 1.25 | 0.00 | +43.6% (over +40%) | +28.4% |" in text
    # Results from before these fields keep the probes' table alone.
    older = [{k: v for k, v in r.items() if "bytes" not in k} for r in results["records"]]
    assert memory_rows(older, results["meta"]) == []
    assert "speculation adds" not in "\n".join(memory_section(older, results["meta"]))
