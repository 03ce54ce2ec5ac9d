"""draftwise measure: every experiment behind a published figure is a subcommand that runs at tiny
size here, prints its figures and keeps them in results.json with the host it ran on."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftwise.bench.measure.experiments import EXPERIMENTS, FORMAT, record
from draftwise.cli import main
from draftwise.cli.measure import measure

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_experiment_is_a_command_with_a_module_and_the_pages_citing_it(name):
    experiment = EXPERIMENTS[name]
    assert name in measure.commands, f"no `draftwise measure {name}`"
    importlib.import_module(experiment.module)
    assert experiment.cited_by and all((ROOT / page).is_file() for page in experiment.cited_by), experiment


def test_list_names_every_experiment():
    done = CliRunner().invoke(main, ["measure", "list"])
    assert done.exit_code == 0, done.output
    assert all(f"{name}:" in done.output for name in EXPERIMENTS)


def test_step_overhead_at_tiny_size_keeps_its_figures_beside_the_host(tmp_path):
    done = CliRunner().invoke(
        main, ["measure", "step-overhead", "--runs", "2", "--max-tokens", "12", "--out", str(tmp_path)]
    )
    assert done.exit_code == 0, done.output
    kept = json.loads((tmp_path / "results.json").read_text())
    assert kept["format"] == FORMAT and kept["experiment"] == "step-overhead"
    assert kept["options"] == {"runs": 2, "max_tokens": 12}
    assert {"platform", "cpus", "python"} <= set(kept["meta"]["host"])
    figures = kept["result"]
    assert figures["plain"]["steps"] == 12  # plain decoding: one token a step
    assert 1 <= figures["ngram"]["steps"] <= 12  # the toy's n-gram drafts land some tokens
    assert all(figures[s]["ms"] > 0 and figures[s]["us_per_step"] > 0 for s in ("plain", "ngram"))
    assert figures == json.loads(done.stdout[: done.stdout.rindex("}") + 1])  # the same figures printed


def test_step_overhead_refuses_zero_runs():
    done = CliRunner().invoke(main, ["measure", "step-overhead", "--runs", "0"])
    assert done.exit_code != 0 and "--runs" in done.output


def test_unload_refuses_a_list_of_no_models():
    done = CliRunner().invoke(main, ["measure", "unload", "--models", " , "])
    assert done.exit_code != 0
    assert "names no model" in done.output and "Traceback" not in done.output


def test_record_refuses_an_unknown_experiment(tmp_path):
    with pytest.raises(KeyError, match="unknown experiment 'nope'"):
        record("nope", {}, {"x": 1}, tmp_path)
    assert not (tmp_path / "results.json").exists()


def test_logprob_drift_at_tiny_size(tiny_gguf_dir, tmp_path):
    """Two code_edit prompts through a tiny llama.cpp model, plain and with n-gram drafts: the
    shared tokens are compared and the figures kept."""
    target = str(tiny_gguf_dir / "target.gguf")
    args = ["measure", "logprob-drift", "--target", target, "--max-tokens", "8", "--prompts", "2"]
    done = CliRunner().invoke(main, [*args, "--out", str(tmp_path)])
    assert done.exit_code == 0, done.output
    figures = json.loads((tmp_path / "results.json").read_text())["result"]
    assert len(figures["prompts"]) == 2
    assert figures["tokens_compared"] == sum(p["shared"] for p in figures["prompts"]) > 0
    assert 0 <= figures["median_abs_diff"] <= figures["p99_abs_diff"] <= figures["max_abs_diff"]
    assert 0 <= figures["equal_to_1e_5"] <= figures["tokens_compared"]


def test_fim_layouts_at_tiny_size(tmp_path):
    """Two fim cuts through a tiny llama.cpp model with Qwen2.5-Coder's FIM tokens, in both orders."""
    from tiny_gguf import write_tiny_gguf

    target = write_tiny_gguf(tmp_path / "fim.gguf", seed=0, fim=True)
    args = ["measure", "fim-layouts", "--target", str(target), "--max-tokens", "4", "--cuts", "2"]
    done = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    figures = json.loads((tmp_path / "out" / "results.json").read_text())["result"]
    assert [(c["layout"]) for c in figures["completions"]] == ["psm", "spm", "psm", "spm"]
    assert all(1 <= c["tokens"] <= 4 and 0 <= c["edit_similarity"] <= 1 for c in figures["completions"])
    for layout in ("psm", "spm"):
        assert figures[layout]["cuts"] == 2 and 0 <= figures[layout]["exact"] <= 2


def test_openmp_teams_command_at_tiny_size(tiny_gguf_dir, tmp_path):
    model = str(tiny_gguf_dir / "target.gguf")
    args = ["measure", "openmp-teams", "--model", model, "--rounds", "1", "--forwards", "2", "--threads", "1"]
    done = CliRunner().invoke(main, [*args, "--out", str(tmp_path)])
    assert done.exit_code == 0, done.output
    kept = json.loads((tmp_path / "results.json").read_text())
    assert kept["options"]["rounds"] == 1 and len(kept["result"]["one_team_ms"]) == 1
    assert kept["result"]["slowdown"] > 0
