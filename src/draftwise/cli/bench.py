"""draftwise bench: methods x prompts on one engine (bench-serve, the load test of a running server,
is cli/bench_serve.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from draftwise import models
from draftwise.cli.common import (
    calibration_progress,
    csv,
    download_progress,
    friendly_errors,
    load_options,
    model_options,
    say_skipped,
)
from draftwise.errors import ConfigError
from draftwise.loading import FREE_DRAFTERS
from draftwise.types import SamplingParams

# Tokens per turn unless --max-tokens says otherwise: the quick suite is a smoke run.
QUICK_MAX_TOKENS, MAX_TOKENS = 128, 256
SAMPLING = SamplingParams()


@click.command()
@click.option(
    "--suite",
    default=None,
    help="Shipped prompts: quick (2 per category), full, or one category's file; long (opt-in, not in "
    "full: 8k-28k token contexts, needs --n-ctx 32768). Default: quick.",
)
@click.option(
    "--prompts",
    "prompts_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="A Spec-Bench-style JSONL prompt file instead of a suite.",
)
@click.option("--categories", default=None, help="Only these categories, comma-separated.")
@click.option(
    "--methods",
    default="baseline,auto,draft,ngram",
    show_default=True,
    help="Comma-separated: baseline, draft, ngram, heuristic, auto, D1+D2 (auto over both), POLICY:D.",
)
@click.option(
    "--max-tokens",
    type=int,
    default=None,
    help=f"Per turn. Default: {QUICK_MAX_TOKENS} for --suite quick, else {MAX_TOKENS}.",
)
@click.option(
    "--temperature",
    callback=csv(float),
    default="0",
    show_default=True,
    help="Target temperature(s), comma-separated: one record set each (0 = greedy).",
)
@click.option(
    "--draft-temperature",
    callback=csv(float, allow_same=True),
    default="same",
    show_default=True,
    help="Draft model temperature(s), comma-separated; 'same' = the target's.",
)
@click.option(
    "--k",
    "ks",
    callback=csv(int),
    default="4",
    show_default=True,
    help="Draft length(s) k, comma-separated: one record set each.",
)
@click.option(
    "--branches",
    callback=csv(int),
    default="1",
    show_default=True,
    help="Token-tree widths for fixed-policy n-gram methods (greedy): 1 = a chain; e.g. 1,3.",
)
@click.option("--repeats", type=int, default=1, show_default=True, help="Run each prompt N times; keep the median.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--top-p", type=float, default=SAMPLING.top_p, show_default=True)
@click.option("--top-k", type=int, default=SAMPLING.top_k, show_default=True)
@click.option("--min-p", type=float, default=SAMPLING.min_p, show_default=True)
@click.option("--ignore-eos", is_flag=True, help="Always generate --max-tokens tokens (for speed over long outputs).")
@click.option("--context-sweep", is_flag=True, help="Pad prompts to each --context-lengths size.")
@click.option("--context-lengths", callback=csv(int), default="256,1024,4096", show_default=True)
@click.option(
    "--draft-model",
    default=models.DEFAULT_DRAFT,
    show_default=True,
    help="Draft model for the draft/heuristic/auto methods ('none': n-gram only). Loaded only if needed.",
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench-out", show_default=True)
@click.option("--resume", is_flag=True, help="Continue the results.json in --out, skipping finished prompts.")
@click.option(
    "--report-only", is_flag=True, help="Only rewrite report.md, report.html and the plots from --out/results.json."
)
@click.option("--datastore", default=None, help="A retrieval datastore (draftwise index build): drafter 'datastore'.")
@model_options
@friendly_errors
def bench(
    suite,
    prompts_file,
    categories,
    methods,
    max_tokens,
    temperature,
    draft_temperature,
    ks,
    branches,
    repeats,
    seed,
    top_p,
    top_k,
    min_p,
    ignore_eos,
    context_sweep,
    context_lengths,
    draft_model,
    out_dir,
    resume,
    report_only,
    datastore,
    target,
    backend,
    n_ctx,
    threads,
    dtype,
    device,
) -> None:
    """Benchmark methods per task category; writes results.json, report.md, report.html and PNG plots to --out."""
    from draftwise.bench.reports import report as bench_report
    from draftwise.bench.suites import prompts as bench_prompts
    from draftwise.bench.sweep.engine_setup import calibration_meta, load_bench_engine
    from draftwise.bench.sweep.methods import parse_methods
    from draftwise.bench.sweep.runner import BenchConfig, BenchRunner, RichProgress, load_results

    out = Path(out_dir)
    if report_only:
        results = load_results(out / "results.json")
        path = bench_report.write_report(results, out)
        click.echo(f"report: {path}\nhtml: {path.with_name(bench_report.HTML_NAME)}", err=True)
        _print_bench_tables(results)
        return
    if suite and prompts_file:
        raise ConfigError("give --suite or --prompts, not both")
    if prompts_file:
        pool = bench_prompts.load_prompts(prompts_file)
        source = str(prompts_file)
    else:
        suite = suite or "quick"
        pool = bench_prompts.load_suite(suite)
        source = f"suite {suite}"
    chosen = bench_prompts.filter_categories(pool, [c.strip() for c in categories.split(",")] if categories else None)
    if max_tokens is None:
        max_tokens = QUICK_MAX_TOKENS if suite == "quick" else MAX_TOKENS
    draft_model = None if draft_model in (None, "", "none") else draft_model
    free = [*FREE_DRAFTERS] + (["datastore"] if datastore else [])
    specs = parse_methods(methods, free + (["draft"] if draft_model else []))
    need_draft = any("draft" in m.drafters for m in specs)
    auto_only = all(m.policy == "auto" for m in specs if "draft" in m.drafters)
    config = BenchConfig(
        methods=tuple(m.name for m in specs),
        max_tokens=max_tokens,
        temperatures=temperature,
        ks=ks,
        branches=branches,
        draft_temperatures=draft_temperature,
        repeats=repeats,
        context_lengths=context_lengths if context_sweep else (),
        seed=seed,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        ignore_eos=ignore_eos,
    )
    n_ctx = _fitting_context(config, n_ctx, chosen)
    if not any(not m.enabled for m in specs):
        click.echo("note: no baseline among the methods, so speedup and identical are not computed", err=True)
    options = replace(load_options(backend, n_ctx, threads, dtype, device), n_seq_max=max(config.branches))
    # The auto methods' cost curves are calibrated here (first run only), before any run is timed.
    with download_progress() as report, calibration_progress() as calibrating:
        loaded = load_bench_engine(
            target,
            draft_model,
            need_draft=need_draft,
            options=options,
            progress=report,
            datastore=datastore,
            auto_only=auto_only,
            # Plain requests also make the engine's auto policy, which reads the target's curve.
            calibrate=any(m.speculation(1, None).policy == "auto" for m in specs),
            calibration_progress=calibrating,
        )
    say_skipped(loaded.engine)
    need_draft = need_draft and not loaded.engine.skipped_drafters
    meta = {
        "target": target,
        "draft_model": draft_model if need_draft else None,
        "prompts": source,
        "num_prompts": len(chosen),
        "backend": backend,
        "n_ctx": n_ctx,
        "threads": threads,
        "memory": loaded.memory,
        **calibration_meta(loaded.calibration),
    }
    runner = BenchRunner(
        loaded.engine, chosen, config, out, resume=resume, progress=RichProgress(), meta=meta, filler_pool=pool
    )
    try:
        results = runner.run()
    finally:
        # An interrupted run still gets a report of what it finished.
        path = bench_report.write_report(runner.results, out)
        click.echo(f"results: {runner.path}\nreport: {path}\nhtml: {path.with_name(bench_report.HTML_NAME)}", err=True)
    _print_bench_tables(results)


def _fitting_context(config, n_ctx: int, prompts=()) -> int:
    """n_ctx, raised (with a note) to hold the longest prompt (padded or shipped) plus two turns of
    output, or a long conversation whole: its turns and an answer of its length to each. A prompt's
    tokens are guessed from its characters (4.5 a token: the long suite's source files run 4.7
    with the default tokenizer, dense code 3.5-4), before any tokenizer is loaded; a guess short
    of the truth shows as that prompt's context error in the report, never as a window beyond
    the model's."""
    longest = max((_guess_tokens(p, config.max_tokens) for p in prompts), default=0)
    shipped = max(config.context_lengths) if config.context_lengths else 1536
    needed = max(shipped + 2 * config.max_tokens, longest) + 256
    if needed > n_ctx:
        click.echo(f"note: raising --n-ctx from {n_ctx} to {needed} to fit the prompts and --max-tokens", err=True)
    return max(n_ctx, needed)


def _print_bench_tables(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from draftwise.bench.reports import report as bench_report

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # piped or captured: do not squeeze the table into 80 columns
    for setting, group in bench_report.by_setting(results.get("records", [])).items():
        table = Table(title=bench_report.setting_label(setting))
        for col in bench_report.TABLE_HEADERS:
            table.add_column(col, justify="left" if col in ("category", "method") else "right")
        for row in bench_report.category_rows(group):
            table.add_row(*row)
        console.print(table)


def _guess_tokens(prompt, max_tokens: int) -> int:
    """A conversation's tokens at its end: every turn's characters / 4.5 and an answer to each."""
    answer = prompt.max_tokens or max_tokens
    chars = sum(len(t) for t in prompt.turns) + len(prompt.suffix or "")
    return int(chars / 4.5) + answer * len(prompt.turns)
