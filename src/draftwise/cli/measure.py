"""draftwise measure NAME: the experiments behind the figures the docs and README publish
(bench/measure/), one subcommand each. Every one prints its result as JSON on stdout, shows its
progress on stderr and, with --out, keeps results.json there with the host it ran on
(bench/measure/experiments.py's record)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from draftwise.cli.common import friendly_errors

OUT = click.option(
    "--out", type=click.Path(file_okay=False), default=None, help="Directory to keep results.json in (the host too)."
)


@click.group()
def measure() -> None:
    """Re-run a published measurement (`draftwise measure list` names them and the pages citing each)."""


def _finish(name: str, options: dict, result, out: str | None, extra: dict | None = None) -> None:
    """The result on stdout; with --out, results.json beside the host record."""
    from dataclasses import asdict

    from draftwise.bench.measure.experiments import record

    figures = {**asdict(result), **(extra or {})}
    if out is not None:
        record(name, options, figures, Path(out))
    click.echo(json.dumps(figures, indent=1))


@measure.command("list")
def list_experiments() -> None:
    """The experiments, what each measures and the pages whose figures it reproduces."""
    from draftwise.bench.measure.experiments import EXPERIMENTS

    for e in EXPERIMENTS.values():
        click.echo(f"{e.name}: {e.summary}\n    cited by {', '.join(e.cited_by)}")


@measure.command("fim-layouts")
@click.option("--target", default=None, help="Registry name or GGUF file (default: the default target).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True, help="Tokens per middle.")
@click.option("--cuts", type=click.IntRange(min=1), default=None, help="The first N cuts of the fim suite (all).")
@OUT
@friendly_errors
def fim_layouts(target, max_tokens, cuts, out) -> None:
    """Prefix-suffix-middle against suffix-prefix-middle completions (docs/code-completion.md)."""
    from draftwise import models
    from draftwise.bench.measure import fim_layouts as experiment

    def tick(one) -> None:
        click.echo(f"fim-layouts: cut {one.cut} {one.layout}: exact {one.exact_match}", err=True)

    target = target or models.DEFAULT_TARGET
    result = experiment.measure(target, max_tokens=max_tokens, num_cuts=cuts, on_completion=tick)
    _finish("fim-layouts", {"target": target, "max_tokens": max_tokens, "cuts": cuts}, result, out)


@measure.command("logprob-drift")
@click.option("--target", default=None, help="Registry name or GGUF file (default: the default target).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True, help="Tokens per answer.")
@click.option("--k", type=click.IntRange(min=1), default=4, show_default=True, help="Draft tokens per step.")
@click.option("--prompts", type=click.IntRange(min=1), default=6, show_default=True, help="code_edit prompts used.")
@OUT
@friendly_errors
def logprob_drift(target, max_tokens, k, prompts, out) -> None:
    """Logprobs under speculation against plain decoding on llama.cpp (docs/exactness.md)."""
    from draftwise import models
    from draftwise.bench.measure import logprob_drift as experiment

    def tick(one) -> None:
        click.echo(f"logprob-drift: prompt {one.question_id}, {one.shared} tokens shared", err=True)

    target = target or models.DEFAULT_TARGET
    result = experiment.measure(target, max_tokens=max_tokens, k=k, num_prompts=prompts, on_prompt=tick)
    options = {"target": target, "max_tokens": max_tokens, "k": k, "prompts": prompts}
    _finish("logprob-drift", options, result, out)


@measure.command("openmp-teams")
@click.option("--model", required=True, help="A GGUF file or registry name whose one-row forwards are timed.")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True, help="Processes per arrangement.")
@click.option("--forwards", type=click.IntRange(min=1), default=20, show_default=True, help="Timed forwards a process.")
@OUT
@friendly_errors
def openmp_teams(model, threads, rounds, forwards, out) -> None:
    """One-row forwards with one OpenMP team in the process against two (docs/bench/serve-peers)."""
    from draftwise.bench.measure import openmp_teams as experiment

    def tick(arrangement: str) -> None:
        click.echo(f"openmp-teams: one process with {arrangement} done", err=True)

    result = experiment.measure(model, threads=threads, rounds=rounds, forwards=forwards, on_run=tick)
    _finish("openmp-teams", {"model": model, "threads": threads, "rounds": rounds, "forwards": forwards}, result, out)


@measure.command("step-overhead")
@click.option(
    "--runs", type=click.IntRange(min=1), default=15, show_default=True, help="Runs per setting; the best counts."
)
@click.option("--max-tokens", type=click.IntRange(min=1), default=200, show_default=True, help="Tokens per run.")
@OUT
@friendly_errors
def step_overhead(runs, max_tokens, out) -> None:
    """The engine's Python time per step over the exact toy backend, plain and with n-gram drafts
    (docs/bench/step-overhead)."""
    from draftwise.bench.measure import step_overhead as experiment

    def tick(setting: str) -> None:
        click.echo(f"step-overhead: one {setting} run done", err=True)

    result = experiment.measure(runs=runs, max_tokens=max_tokens, on_run=tick)
    _finish("step-overhead", {"runs": runs, "max_tokens": max_tokens}, result, out)


@measure.command("unload")
@click.option("--models", required=True, help="Comma-separated registry names or GGUF files.")
@click.option("--cycles", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--max-memory", type=float, default=None, metavar="GIB", help="The model pool's budget.")
@click.option("--draft", default="ngram,prediction,grammar,calls", show_default=True, help="Each model's drafters.")
@click.option("--n-ctx", type=int, default=4096, show_default=True)
@click.option("--threads", type=int, default=None)
@OUT
@friendly_errors
def unload(models, cycles, max_memory, draft, n_ctx, threads, out) -> None:
    """Resident memory after models are loaded, asked for a few tokens and unloaded in turn through
    the server's model pool, cycle after cycle (docs/bench/unload-cycles)."""
    from draftwise.bench.measure import unload as experiment

    result = experiment.unload_cycles(
        experiment.sources(models, draft, n_ctx=n_ctx, threads=threads),
        experiment.make_state,
        num_cycles=cycles,
        budget_bytes=int(max_memory * 2**30) if max_memory else None,
        on_cycle=lambda cycle, loaded, unloaded: print(
            f"cycle {cycle}: {loaded:.1f} MiB loaded, {unloaded:.1f} MiB unloaded", file=sys.stderr, flush=True
        ),
    )
    options = {"models": models, "cycles": cycles, "max_memory": max_memory, "draft": draft, "n_ctx": n_ctx}
    _finish("unload", {**options, "threads": threads}, result, out, {"growth": round(result.growth, 4)})
