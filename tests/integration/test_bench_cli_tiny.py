"""`draftwise bench` end to end through the CLI on tiny random GGUF models (llama.cpp): the
model-loading path, memory probes, results.json, report.md, report.html, plots and --resume.
"""

import json

from click.testing import CliRunner

from draftwise.cli import main


def test_bench_cli_on_tiny_models(tiny_gguf_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"question_id": 1, "category": "code_edit", "turns": ["copy this: a b c d e f a b c d e f"]})
        + "\n"
        + json.dumps({"question_id": 2, "category": "multi_turn", "turns": ["hello there", "and again"]})
        + "\n"
    )
    out = tmp_path / "out"
    args = [
        "bench",
        "--prompts",
        str(prompts),
        "--methods",
        "baseline,draft,ngram",
        "--max-tokens",
        "12",
        "--target",
        str(tiny_gguf_dir / "target.gguf"),
        "--draft-model",
        str(tiny_gguf_dir / "twin.gguf"),
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and len(results["records"]) == 3 * 3  # 3 prompt-turns x 3 methods
    assert all(r["error"] is None and r["new_tokens"] > 0 for r in results["records"])
    memory = results["meta"]["memory"]
    assert "draft_overhead_mb" in memory and "rss_target_mb" in memory
    assert all(
        r["memory_overhead_mb"] == memory["draft_overhead_mb"] for r in results["records"] if r["method"] == "draft"
    )
    assert "| code_edit | ngram k=4 |" in (out / "report.md").read_text()
    # The models' weights beside the probes, and per record the KV caches and the drafters' state.
    assert memory["target_weights_mb"] > 0 and memory["draft_weights_mb"] > 0
    for r in results["records"]:
        assert 0 < r["kv_target_bytes"]["used"] < r["kv_target_bytes"]["allocated"]
        assert ("kv_draft_bytes" in r) == (r["method"] == "draft")
        assert set(r["drafter_bytes"]) == ({"ngram"} if r["method"] == "ngram" else set())
    assert "| draft k=4 | 3 |" in (out / "report.md").read_text().split("speculation adds")[-1]
    assert (out / "speedup_by_category.png").exists()
    assert f"html: {out / 'report.html'}" in result.output
    html = (out / "report.html").read_text(encoding="utf-8")
    assert 'data-source="target"' in html and "data:image/png;base64," in html
    # The first prompt of each category keeps its answers' token sources, every method's.
    traced = {(r["question_id"], r["method"]) for r in results["records"] if r.get("spans")}
    assert traced == {(q, m) for q in (1, 2) for m in ("baseline", "draft", "ngram")}

    again = CliRunner().invoke(main, [*args, "--resume"])
    assert again.exit_code == 0, again.output
    assert json.loads((out / "results.json").read_text())["records"] == results["records"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "already exists" in refused.output


def test_bench_cli_loads_no_draft_model_when_no_method_needs_it(tiny_gguf_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "chat", "turns": ["hi"]}) + "\n")
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--prompts",
            str(prompts),
            "--methods",
            "baseline,ngram",
            "--max-tokens",
            "8",
            "--target",
            str(tiny_gguf_dir / "target.gguf"),
            "--draft-model",
            str(tmp_path / "missing.gguf"),
            "--threads",
            "1",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "out" / "results.json").read_text())["meta"]
    assert meta["drafters"] == ["ngram", "suffix", "grammar", "prediction", "calls"] and meta["draft_model"] is None
