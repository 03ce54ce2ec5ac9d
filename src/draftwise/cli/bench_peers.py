"""draftwise bench-serve --server / --peer: several OpenAI-compatible servers side by side on the same
suites (bench/side_by_side/peers.py), the ones named by kind started here and stopped at the end."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import click

LLAMA_SERVER_HELP = (
    "llama-server's binary for --peer llama-server... (default: where scripts/build_llama_server.sh puts it, "
    "~/.cache/draftwise/llama-server/VERSION/bin/llama-server)."
)


def peer_options(fn):
    """The side-by-side options of bench-serve."""
    options = [
        click.option(
            "--server",
            "servers",
            multiple=True,
            metavar="NAME=URL",
            help="Side by side: a running OpenAI-compatible server to compare (repeatable; with --peer).",
        ),
        click.option(
            "--peer",
            "peers",
            multiple=True,
            metavar="[NAME=]KIND[:ARGS]",
            help="Side by side: a server to start and compare (repeatable): 'draftwise' (draftwise serve, ARGS its "
            "options), 'llama-server' (plain) or 'llama-server:METHOD' (its --spec-type: draft-simple, ngram-simple, "
            "ngram-mod, ngram-map-k, ...; further llama-server options after it), each on --target with --threads "
            "and --n-ctx.",
        ),
        click.option(
            "--baseline",
            default=None,
            help="Side by side: the server the others are a ratio to (default: the first --server, else the "
            "first --peer).",
        ),
        click.option(
            "--peer-suite",
            "peer_suites",
            multiple=True,
            metavar="NAME=SOURCE[,max_tokens=N][,per_category=N][,limit=N]",
            help="Side by side: a row of the table: a shipped suite or a JSONL file (repeatable). "
            "Default: one row of --suite/--prompts at --max-tokens.",
        ),
        click.option(
            "--target",
            default=None,
            help="Side by side: the GGUF every started server runs (a registry name or a path; default: the "
            "default target).",
        ),
        click.option(
            "--draft-model",
            default=None,
            help="Side by side: llama-server draft-simple's draft (default: the default draft).",
        ),
        click.option(
            "--threads",
            type=click.IntRange(min=1),
            default=None,
            help="Side by side: CPU threads of every started server (default: the CPUs this process may use).",
        ),
        click.option(
            "--n-ctx",
            type=click.IntRange(min=16),
            default=None,
            help="Side by side: context size of every started server (default: draftwise serve's).",
        ),
        click.option("--llama-server", "llama_server", default=None, help=LLAMA_SERVER_HELP),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@dataclass(frozen=True)
class PeerOptions:
    """peer_options' values."""

    servers: tuple[str, ...]
    peers: tuple[str, ...]
    baseline: str | None
    peer_suites: tuple[str, ...]
    target: str | None
    draft_model: str | None
    threads: int | None
    n_ctx: int | None
    llama_server: str | None

    @property
    def wanted(self) -> bool:
        return bool(self.servers or self.peers)


def default_llama_server() -> Path:
    """Where scripts/build_llama_server.sh puts the binary for the installed llama-cpp-python."""
    version = importlib.metadata.version("llama-cpp-python")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "draftwise" / "llama-server" / version / "bin" / "llama-server"


def _usable_cpus() -> int:
    """The CPUs this process may run on: draftwise serve's default threads, given to llama-server too."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _setup(options: PeerOptions, specs) -> object:
    """The PeerSetup of the started peers: only what they need is resolved (models must be pulled)."""
    from draftwise import models
    from draftwise.bench.side_by_side.peer_servers import PeerSetup
    from draftwise.loading import LoadOptions

    started = [s for s in specs if s.kind]
    if not started:
        return None
    draft = None
    if any(s.kind == "llama-server" and s.args[0] == "draft-simple" for s in started):
        draft = str(models.resolve(options.draft_model or models.DEFAULT_DRAFT, fetch=False))
    binary = None
    if any(s.kind == "llama-server" for s in started):
        binary = options.llama_server or str(default_llama_server())
    # draftwise serve is told only what the command line gave: a peer "with defaults" is what a user runs.
    given = {"--target": options.target, "--threads": options.threads, "--n-ctx": options.n_ctx}
    return PeerSetup(
        target=str(models.resolve(options.target or models.DEFAULT_TARGET, fetch=False)),
        threads=options.threads or _usable_cpus(),
        n_ctx=options.n_ctx or LoadOptions().n_ctx,
        draft_model=draft,
        llama_server=binary,
        serve_args=tuple(a for option, value in given.items() if value is not None for a in (option, str(value))),
    )


def _suites(options: PeerOptions, suite: str | None, prompts_file: str | None, max_tokens: int) -> list:
    from draftwise.bench.side_by_side.peers import PeerSuite

    if options.peer_suites:
        return [PeerSuite.parse(spec, max_tokens) for spec in options.peer_suites]
    if suite and prompts_file:
        raise click.UsageError("side by side, give --suite or --prompts (or several --peer-suite), not both")
    if prompts_file:
        return [PeerSuite(Path(prompts_file).stem, prompts_file, max_tokens)]
    return [PeerSuite(suite or "quick", suite or "quick", max_tokens)]


def run(
    options: PeerOptions, *, suite, prompts_file, max_tokens, timeout_s, api_key, startup_timeout, out: Path
) -> None:
    """Start the --peer servers one after another, describe every server, run the suites, write the report."""
    from draftwise.bench.serving.serve_process import redact_api_keys
    from draftwise.bench.side_by_side import peer_servers, peers, peers_report

    specs = [peer_servers.ServerSpec.at_url(s) for s in options.servers]
    specs += [peer_servers.ServerSpec.peer(s) for s in options.peers]
    names = [s.name for s in specs]
    if len(specs) < 2 or len(set(names)) != len(names):
        raise click.UsageError(f"side by side needs two or more servers with different names, got {', '.join(names)}")
    baseline = options.baseline or names[0]
    if baseline not in names:
        raise click.BadParameter(f"{baseline!r} is not one of {', '.join(names)}", param_hint="--baseline")
    suites = _suites(options, suite, prompts_file, max_tokens)
    for s in suites:
        s.prompts()  # a bad file or suite is said before any server starts
    setup = _setup(options, specs)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with contextlib.ExitStack() as stack:
        contenders, pids = [], []
        for spec in specs:
            if spec.url:
                contenders.append(peers.contender(spec.name, spec.url, headers))
                continue
            started = stack.enter_context(peer_servers.start(spec, setup, startup_timeout))
            command = peer_servers.shown_command(redact_api_keys(started.command))
            click.echo(f"started {spec.name}: {command}", err=True)
            contenders.append(peers.contender(spec.name, started.url, headers, command))
            pids.append(started.proc.pid)

        def said(records) -> None:
            r0 = records[0]
            speeds = ", ".join(
                f"{r.server} {r.decode_tokens_per_second:.1f}" if r.decode_tokens_per_second else f"{r.server} FAILED"
                for r in sorted(records, key=lambda r: names.index(r.server))
            )
            click.echo(f"{r0.suite} {r0.question_id} ({r0.category}): {speeds} tok/s", err=True)

        results = peers.run_peers(
            contenders,
            suites,
            baseline=baseline,
            headers=headers,
            timeout_s=timeout_s,
            server_pids=pids,
            meta={"command": shlex.join(["draftwise", *redact_api_keys(sys.argv[1:])])},
            progress=said,
        )
    report = peers_report.write_outputs(results, out)
    click.echo(f"results: {out / 'results.json'}\nreport: {report}", err=True)
    click.echo(peers_report.ratio_table(results))
