"""draftwise bench (methods x prompts on one engine) and bench-serve (a load test of a running
server)."""

from __future__ import annotations

import contextlib
import sys
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
SOAK_PROGRESS_EVERY_S = 10.0  # bench-serve --duration: seconds between progress lines (failures always show)
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
    from draftwise.bench import prompts as bench_prompts
    from draftwise.bench import report as bench_report
    from draftwise.bench.engine_setup import calibration_meta, load_bench_engine
    from draftwise.bench.methods import parse_methods
    from draftwise.bench.runner import BenchConfig, BenchRunner, RichProgress, load_results

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

    from draftwise.bench import report as bench_report

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


@click.command("bench-serve")
@click.argument("compare_dirs", nargs=-1, type=click.Path(exists=True), metavar="[RESULTS]...")
@click.option(
    "--url",
    default=None,
    help="A running OpenAI-compatible server (draftwise serve, llama-server, ...). "
    "Default: start draftwise serve on a free loopback port for the run.",
)
@click.option(
    "--serve-args",
    default="",
    help='Options for the draftwise serve started without --url, e.g. "--draft ngram --k 8".',
)
@click.option(
    "--startup-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds to wait for the started server's /health.",
)
@click.option(
    "--api-key",
    default=None,
    help="Send 'Authorization: Bearer KEY' (a server started with --serve-args "
    '"--api-key KEY" needs it too). Never written to the results.',
)
@click.option("--model", default=None, help="The requests' model field. Default: the first one /v1/models lists.")
@click.option(
    "--suite",
    default=None,
    help="Shipped prompts (the first turn of each): quick, full, or one category's file. "
    "Default: quick, unless --prompts is given; with --prompts, both sets are sent.",
)
@click.option(
    "--prompts",
    "prompts_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="A Spec-Bench-style JSONL prompt file (the first turn of each); a prompt's own max_tokens, "
    "where the file sets one, overrides --max-tokens.",
)
@click.option(
    "--concurrency",
    "levels",
    callback=csv(int),
    default="1,2,4,8",
    show_default=True,
    help="Concurrent clients per level, comma-separated.",
)
@click.option(
    "--requests",
    "num_requests",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Requests per level, shared by its clients (not with --duration).",
)
@click.option(
    "--duration",
    "duration_min",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Soak: minutes for which the clients of the one --concurrency level keep sending requests, "
    "while the server's RSS is sampled; the report says whether RSS stayed flat and nothing failed.",
)
@click.option(
    "--rss-every",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="--duration: seconds between samples of the server's RSS.",
)
@click.option(
    "--warm-minutes",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="--duration: RSS must stay within 5% of its value at this minute from then on.",
)
@click.option(
    "--server-pid",
    type=int,
    default=None,
    help="--duration with --url: the server's process id, whose RSS (children included) is sampled. "
    "A started server's is sampled without it.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="--duration: the clients' prompt orders.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds a request may wait for the server's next bytes before it counts as an error.",
)
@click.option(
    "--label",
    default=None,
    help="This run's name in reports and --compare (default: 'draftwise' for a started server, else the URL).",
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench-serve-out", show_default=True)
@click.option(
    "--compare",
    is_flag=True,
    help="Only compare RESULTS (bench-serve --out directories or results.json "
    "files), the first as the reference; writes --out/compare.md.",
)
@click.option(
    "--keystrokes",
    is_flag=True,
    help="Instead of chat load: replay users typing code, /infill requests as llama.vim sends them, at "
    "typing speed (each superseding the last), one after another, and with nothing cached "
    "(bench/keystrokes.py). Sessions come from the fim suite.",
)
@click.option("--sessions", type=click.IntRange(1, 28), default=3, show_default=True, help="--keystrokes: sessions.")
@click.option(
    "--modes",
    callback=csv(str),
    default="typing,warm,cold",
    show_default=True,
    help="--keystrokes: which replays (typing: at typing speed, superseding; warm; cold).",
)
@click.option(
    "--chars", type=click.IntRange(2, 200), default=20, show_default=True, help="--keystrokes: characters typed."
)
@click.option(
    "--every", type=click.IntRange(1, 50), default=2, show_default=True, help="--keystrokes: characters per request."
)
@click.option(
    "--char-ms",
    type=click.FloatRange(min=0),
    default=100.0,
    show_default=True,
    help="--keystrokes: ms per typed character.",
)
@click.option(
    "--prefix-lines",
    type=click.IntRange(1, 4096),
    default=256,
    show_default=True,
    help="--keystrokes: lines above the cursor sent (llama.vim's n_prefix).",
)
@click.option(
    "--suffix-lines",
    type=click.IntRange(0, 4096),
    default=64,
    show_default=True,
    help="--keystrokes: lines below sent (llama.vim's n_suffix).",
)
@click.option(
    "--open-line/--no-open-line",
    default=True,
    show_default=True,
    help="--keystrokes: typing and warm sessions first send the request of the opened line (nothing typed) "
    "and wait for its answer, as an editor asks when the cursor arrives and the user reads the suggestion; "
    "--no-open-line starts typing on whatever the cache holds.",
)
@friendly_errors
def bench_serve(
    compare_dirs,
    url,
    serve_args,
    startup_timeout,
    api_key,
    model,
    suite,
    prompts_file,
    levels,
    num_requests,
    duration_min,
    rss_every,
    warm_minutes,
    server_pid,
    seed,
    max_tokens,
    timeout_s,
    label,
    out_dir,
    compare,
    keystrokes,
    sessions,
    modes,
    chars,
    every,
    char_ms,
    prefix_lines,
    suffix_lines,
    open_line,
) -> None:
    """Load-test an OpenAI-compatible server: C streaming clients per level; tok/s, TTFT and latency percentiles.

    Writes results.json, report.md and throughput.png to --out. With --compare, reads earlier runs instead.
    With --duration, a soak: one level for that long, the server's RSS sampled (rss.png).
    """
    import shlex

    from draftwise.bench import load, load_report
    from draftwise.bench.prompts import load_prompts, load_suite

    out = Path(out_dir)
    if compare or compare_dirs:
        if not compare or len(compare_dirs) < 2:
            raise click.UsageError("give --compare and at least two RESULTS to compare")
        table = load_report.compare_markdown([load_report.load_run(p) for p in compare_dirs])
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(table)
        click.echo(table)
        click.echo(f"compare: {out / 'compare.md'}", err=True)
        return
    if any(c < 1 for c in levels):
        raise click.BadParameter(f"levels must be >= 1, got {','.join(map(str, levels))}", param_hint="--concurrency")
    if url and serve_args:
        raise click.UsageError("--serve-args is for the server bench-serve starts; it cannot change the one at --url")
    if duration_min is not None:
        if len(levels) != 1:
            raise click.UsageError(
                f"--duration runs one concurrency level for the whole time; give one with --concurrency "
                f"(got {','.join(map(str, levels))})"
            )
        if keystrokes:
            raise click.UsageError("--duration is a soak of chat requests; it does not go with --keystrokes")
    if server_pid is not None and (duration_min is None or not url):
        raise click.UsageError("--server-pid goes with --duration and --url (a started server's RSS is sampled anyway)")
    pool, sources = [], []
    if prompts_file:
        pool += load_prompts(prompts_file)
        sources.append(str(prompts_file))
    if suite or not prompts_file:
        pool += load_suite(suite or "quick")
        sources.append(f"suite {suite or 'quick'}")
    # Chat prompts only: a fill-in-the-middle cut (suffix) or a tool prompt is another request shape.
    # NOTE: getattr: a prompt's max_tokens is optional in the file format.
    prompts = [
        (p.turns[0], getattr(p, "max_tokens", None)) if getattr(p, "max_tokens", None) else p.turns[0]
        for p in pool
        if p.suffix is None and not p.tools
    ]
    if not prompts:
        raise ConfigError(
            f"no chat prompts in {' and '.join(sources)} (fill-in-the-middle and tool prompts are not sent)"
        )
    server = (
        contextlib.nullcontext()
        if url
        else load.ServeProcess(shlex.split(serve_args), startup_timeout_s=startup_timeout)
    )
    meta = {
        "label": label or ("draftwise" if not url else url),
        "prompts": " + ".join(sources),
        "command": shlex.join(["draftwise", *load.redact_api_keys(sys.argv[1:])]),
    }
    with server as started:
        if started is not None:
            # command: [python, -m, draftwise.cli, serve, ...]
            meta["serve_command"] = shlex.join(["draftwise", *load.redact_api_keys(started.command[3:])])
            click.echo(f"started {meta['serve_command']} at {started.url}", err=True)
        if keystrokes:
            from draftwise.bench import keystrokes as ks

            typing = ks.sessions_from(load_suite("fim"), sessions, chars, prefix_lines, suffix_lines)

            def typed(mode, session, got) -> None:
                lat = ", ".join(f"{1000 * r.latency_s:.0f}" + ("s" if r.superseded else "") for r in got)
                click.echo(f"{mode} {session.name}: {lat} ms (s: superseded)", err=True)

            results = ks.run_keystrokes(
                url or started.url,
                typing,
                every=every,
                char_ms=char_ms,
                n_predict=max_tokens,
                timeout_s=timeout_s,
                api_key=api_key,
                meta=meta,
                progress=typed,
                modes=modes,
                open_line=open_line,
            )
            report = ks.write_outputs(results, out)
            click.echo(f"results: {out / 'results.json'}\nreport: {report}", err=True)
            click.echo(ks.markdown(results))
            return

        if duration_min is not None:
            pid = server_pid if url else started.proc.pid
            if pid is None:
                click.echo("note: RSS is not sampled: give --server-pid PID of the server at --url", err=True)
            last_said = [float("-inf")]

            def said(record, t_s: float, rss_mb: float | None) -> None:
                # One line per failure, else at most one every PROGRESS_EVERY_S.
                if record.ok and t_s - last_said[0] < SOAK_PROGRESS_EVERY_S:
                    return
                last_said[0] = t_s
                rss = f", server RSS {rss_mb:.0f} MiB" if rss_mb is not None else ""
                outcome = (
                    f"{record.num_tokens} tokens in {record.latency_s:.1f} s"
                    if record.ok
                    else (f"FAILED ({record.status}): {record.error}")
                )
                click.echo(
                    f"{t_s / 60:6.2f} min: request {record.index} (prompt {record.prompt}) {outcome}{rss}", err=True
                )

            results = load.run_soak(
                url or started.url,
                prompts,
                levels[0],
                duration_min * 60,
                server_pid=pid,
                rss_every_s=rss_every,
                warm_s=warm_minutes * 60,
                seed=seed,
                max_tokens=max_tokens,
                model=model,
                api_key=api_key,
                timeout_s=timeout_s,
                meta=meta,
                progress=said,
            )
            report = load_report.write_outputs(results, out)
            summary = results["soak"]["summary"]
            click.echo(f"results: {out / 'results.json'}\nreport: {report}", err=True)
            click.echo(load_report.level_table(results))
            click.echo(
                f"soak: {summary['num_ok']} requests done, {summary['num_errors']} failed; RSS flat: "
                f"{load_report.verdict_word(summary['flat'])}; passed: {load_report.verdict_word(summary['passed'])}"
            )
            return

        def say(s: dict) -> None:
            click.echo(
                f"C={s['concurrency']}: {s['num_requests']} requests, {s['num_errors']} errors, "
                f"{s['tokens_per_second'] or 0:.1f} tok/s",
                err=True,
            )

        results = load.run_bench(
            url or started.url,
            prompts,
            levels,
            num_requests=num_requests,
            max_tokens=max_tokens,
            model=model,
            api_key=api_key,
            timeout_s=timeout_s,
            meta=meta,
            progress=say,
        )
    report = load_report.write_outputs(results, out)
    click.echo(f"results: {out / 'results.json'}\nreport: {report}", err=True)
    click.echo(load_report.level_table(results))


def _guess_tokens(prompt, max_tokens: int) -> int:
    """A conversation's tokens at its end: every turn's characters / 4.5 and an answer to each."""
    answer = prompt.max_tokens or max_tokens
    chars = sum(len(t) for t in prompt.turns) + len(prompt.suffix or "")
    return int(chars / 4.5) + answer * len(prompt.turns)
