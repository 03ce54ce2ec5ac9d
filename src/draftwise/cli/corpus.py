"""draftwise corpus: a development corpus of edit, fim and copy tasks generated from the source
files on this machine, split by file into dev.jsonl and test.jsonl (bench/corpus/build.py)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from draftwise.cli.common import friendly_errors
from draftwise.errors import ConfigError


@click.command()
@click.option("--out", required=True, type=click.Path(), help="Directory to write the corpus to.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the split and of every choice.")
@click.option("--tasks", type=int, default=300, show_default=True, help="Tasks in all, both splits together.")
@click.option(
    "--test-share", type=float, default=0.5, show_default=True, help="Share of the tasks (and files) for test."
)
@click.option(
    "--source",
    "sources",
    multiple=True,
    help="A source file or directory to use instead of the installed ones (repeatable).",
)
@click.option("--kinds", default="edit,fim,copy", show_default=True, help="Task kinds, comma-separated.")
@friendly_errors
def corpus(out, seed, tasks, test_share, sources, kinds) -> None:
    """Generate a development corpus from source files: OUT/dev.jsonl, OUT/test.jsonl and
    OUT/manifest.json.

    Without --source it uses the Python standard library and site-packages, /usr/include,
    /usr/share/doc and /usr/lib/node_modules. Every task of a file is in the same split.
    """
    from draftwise.bench.corpus import build as bench_corpus
    from draftwise.bench.corpus.sources import default_sources, discover

    chosen = [k.strip() for k in kinds.split(",") if k.strip()]
    unknown = [k for k in chosen if k not in bench_corpus.KINDS]
    if not chosen or unknown:
        raise ConfigError(f"--kinds takes {', '.join(bench_corpus.KINDS)}, got {kinds!r}")
    if tasks < 1:
        raise ConfigError(f"--tasks must be at least 1, got {tasks}")
    if not 0 <= test_share <= 1:
        raise ConfigError(f"--test-share must be between 0 and 1, got {test_share}")
    missing = [s for s in sources if not Path(s).exists()]
    if missing:
        raise ConfigError(f"no such source: {missing[0]}")
    out_dir = writable_dir(Path(out))
    started = time.perf_counter()
    found = discover(list(sources)) if sources else default_sources()
    if not found:
        raise ConfigError(f"no source files found under {', '.join(sources) or 'the default roots'}")
    shares = [bench_corpus.DEFAULT_SHARES[k] for k in chosen]
    made = bench_corpus.build_corpus(found, seed=seed, tasks=tasks, test_share=test_share, kinds=chosen, shares=shares)
    if not made:
        raise ConfigError("no task could be made from the source files")
    manifest = bench_corpus.corpus_manifest(made, seed=seed)
    try:
        paths = bench_corpus.write_corpus(out_dir, made, manifest)
    except OSError as exc:
        raise ConfigError(f"cannot write to {out_dir}: {exc.strerror or exc}") from None
    for split, counts in manifest["counts"].items():
        kinds_text = ", ".join(f"{k} {n}" for k, n in counts["category"].items())
        languages = ", ".join(f"{k} {n}" for k, n in counts["language"].items())
        click.echo(f"{split}: {counts['tasks']} tasks ({kinds_text or 'none'}; {languages or 'no language'})")
    if len(made) < tasks:
        click.echo(f"only {len(made)} of {tasks} tasks: the {len(found)} source files gave no more", err=True)
    click.echo(f"{len(found)} source files, {time.perf_counter() - started:.1f} s -> {', '.join(map(str, paths))}")


def writable_dir(path: Path) -> Path:
    """The directory, created if needed; ConfigError if it cannot be made or written to."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write to {path}: {exc.strerror or exc}") from None
    return path
