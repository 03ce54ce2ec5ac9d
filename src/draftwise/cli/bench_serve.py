"""draftwise bench-serve: a load test of an OpenAI-compatible server (concurrency levels, a soak,
or replayed editor keystrokes), several servers side by side (cli/bench_peers.py), and the
comparison of earlier runs."""

from __future__ import annotations

import contextlib
import shlex
import sys
from pathlib import Path

import click

from draftwise.cli.bench_peers import PeerOptions, peer_options
from draftwise.cli.common import csv, friendly_errors
from draftwise.errors import ConfigError

SOAK_PROGRESS_EVERY_S = 10.0  # --duration: seconds between progress lines (failures always show)


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
    "(bench/serving/keystrokes.py). Sessions come from the fim suite.",
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
@peer_options
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
    **side_by_side,
) -> None:
    """Load-test an OpenAI-compatible server: C streaming clients per level; tok/s, TTFT and latency percentiles.

    Writes results.json, report.md and throughput.png to --out. With --compare, reads earlier runs instead.
    With --duration, a soak: one level for that long, the server's RSS sampled (rss.png).
    With --server/--peer, several servers side by side on the same prompts (report.md: ratios to --baseline).
    """
    from draftwise.bench.serving import load, load_report, serve_process

    out = Path(out_dir)
    if compare or compare_dirs:
        _compare_runs(compare, compare_dirs, out)
        return
    peers = PeerOptions(**side_by_side)
    if peers.wanted:
        if url or serve_args or keystrokes or duration_min is not None:
            raise click.UsageError(
                "--server/--peer compare servers one request at a time; leave out --url, "
                "--serve-args, --keystrokes and --duration"
            )
        _side_by_side(peers, suite, prompts_file, max_tokens, timeout_s, api_key, startup_timeout, out)
        return
    _check_modes(levels, url, serve_args, duration_min, keystrokes, server_pid)
    prompts, sources = _chat_prompts(suite, prompts_file)
    server = (
        contextlib.nullcontext()
        if url
        else serve_process.ServeProcess(shlex.split(serve_args), startup_timeout_s=startup_timeout)
    )
    meta = {
        "label": label or ("draftwise" if not url else url),
        "prompts": " + ".join(sources),
        "command": shlex.join(["draftwise", *serve_process.redact_api_keys(sys.argv[1:])]),
    }
    with server as started:
        if started is not None:
            # command: [python, -m, draftwise.cli, serve, ...]
            meta["serve_command"] = shlex.join(["draftwise", *serve_process.redact_api_keys(started.command[3:])])
            click.echo(f"started {meta['serve_command']} at {started.url}", err=True)
        target = url or started.url
        if keystrokes:
            _run_keystrokes(
                target,
                (sessions, chars, prefix_lines, suffix_lines),
                out,
                meta=meta,
                every=every,
                char_ms=char_ms,
                n_predict=max_tokens,
                timeout_s=timeout_s,
                api_key=api_key,
                modes=modes,
                open_line=open_line,
            )
            return
        if duration_min is not None:
            _run_soak(
                target,
                prompts,
                levels[0],
                duration_min * 60,
                out,
                server_pid=server_pid if url else started.proc.pid,
                rss_every_s=rss_every,
                warm_s=warm_minutes * 60,
                seed=seed,
                max_tokens=max_tokens,
                model=model,
                api_key=api_key,
                timeout_s=timeout_s,
                meta=meta,
            )
            return

        results = load.run_bench(
            target,
            prompts,
            levels,
            num_requests=num_requests,
            max_tokens=max_tokens,
            model=model,
            api_key=api_key,
            timeout_s=timeout_s,
            meta=meta,
            progress=_say_level,
        )
    _said_written(out, load_report.write_outputs(results, out))
    click.echo(load_report.level_table(results))


def _side_by_side(peers, suite, prompts_file, max_tokens, timeout_s, api_key, startup_timeout, out) -> None:
    """--server/--peer: the servers side by side on the same prompts (cli/bench_peers.py)."""
    from draftwise.cli import bench_peers

    bench_peers.run(
        peers,
        suite=suite,
        prompts_file=prompts_file,
        max_tokens=max_tokens,
        timeout_s=timeout_s,
        api_key=api_key,
        startup_timeout=startup_timeout,
        out=out,
    )


def _say_level(s: dict) -> None:
    """A load level's line as it finishes."""
    click.echo(
        f"C={s['concurrency']}: {s['num_requests']} requests, {s['num_errors']} errors, "
        f"{s['tokens_per_second'] or 0:.1f} tok/s",
        err=True,
    )


def _said_written(out: Path, report) -> None:
    click.echo(f"results: {out / 'results.json'}\nreport: {report}", err=True)


def _compare_runs(compare: bool, compare_dirs, out: Path) -> None:
    """--compare: the table of earlier runs' results, printed and written to compare.md."""
    from draftwise.bench.serving import load_report

    if not compare or len(compare_dirs) < 2:
        raise click.UsageError("give --compare and at least two RESULTS to compare")
    table = load_report.compare_markdown([load_report.load_run(p) for p in compare_dirs])
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(table)
    click.echo(table)
    click.echo(f"compare: {out / 'compare.md'}", err=True)


def _check_modes(levels, url, serve_args, duration_min, keystrokes, server_pid) -> None:
    """The options that do not go together, each with its own message."""
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


def _chat_prompts(suite, prompts_file) -> tuple[list, list[str]]:
    """The chat prompts of --prompts and --suite (the quick suite when neither is given), each its
    first turn (with its max_tokens where the file gives one), and where they came from."""
    from draftwise.bench.suites.prompts import load_prompts, load_suite

    pool, sources = [], []
    if prompts_file:
        pool += load_prompts(prompts_file)
        sources.append(str(prompts_file))
    if suite or not prompts_file:
        pool += load_suite(suite or "quick")
        sources.append(f"suite {suite or 'quick'}")
    # Chat prompts only: a fill-in-the-middle cut (suffix) or a tool prompt is another request shape.
    prompts = [
        (p.turns[0], p.max_tokens) if p.max_tokens else p.turns[0] for p in pool if p.suffix is None and not p.tools
    ]
    if not prompts:
        raise ConfigError(
            f"no chat prompts in {' and '.join(sources)} (fill-in-the-middle and tool prompts are not sent)"
        )
    return prompts, sources


def _run_keystrokes(url: str, shape: tuple, out: Path, **options) -> None:
    """--keystrokes: sessions of the fim suite typed against the server's /infill (shape:
    keystrokes.sessions_from's sessions, chars, prefix_lines, suffix_lines; options:
    keystrokes.run_keystrokes'), each request's latency said."""
    from draftwise.bench.serving import keystrokes as ks
    from draftwise.bench.suites.prompts import load_suite

    typing = ks.sessions_from(load_suite("fim"), *shape)

    def typed(mode, session, got) -> None:
        lat = ", ".join(f"{1000 * r.latency_s:.0f}" + ("s" if r.superseded else "") for r in got)
        click.echo(f"{mode} {session.name}: {lat} ms (s: superseded)", err=True)

    results = ks.run_keystrokes(url, typing, progress=typed, **options)
    _said_written(out, ks.write_outputs(results, out))
    click.echo(ks.markdown(results))


def _run_soak(url, prompts, level: int, seconds: float, out: Path, **options) -> None:
    """--duration: one concurrency level for `seconds` (load.run_soak's options: the server's RSS
    sampled at server_pid), a line per failure and at most one per SOAK_PROGRESS_EVERY_S otherwise;
    the verdict printed."""
    from draftwise.bench.serving import load, load_report

    if options["server_pid"] is None:
        click.echo("note: RSS is not sampled: give --server-pid PID of the server at --url", err=True)
    last_said = [float("-inf")]

    def said(record, t_s: float, rss_mb: float | None) -> None:
        if record.ok and t_s - last_said[0] < SOAK_PROGRESS_EVERY_S:
            return
        last_said[0] = t_s
        rss = f", server RSS {rss_mb:.0f} MiB" if rss_mb is not None else ""
        outcome = (
            f"{record.num_tokens} tokens in {record.latency_s:.1f} s"
            if record.ok
            else (f"FAILED ({record.status}): {record.error}")
        )
        click.echo(f"{t_s / 60:6.2f} min: request {record.index} (prompt {record.prompt}) {outcome}{rss}", err=True)

    results = load.run_soak(url, prompts, level, seconds, progress=said, **options)
    _said_written(out, load_report.write_outputs(results, out))
    summary = results["soak"]["summary"]
    click.echo(load_report.level_table(results))
    click.echo(
        f"soak: {summary['num_ok']} requests done, {summary['num_errors']} failed; RSS flat: "
        f"{load_report.verdict_word(summary['flat'])}; passed: {load_report.verdict_word(summary['passed'])}"
    )
