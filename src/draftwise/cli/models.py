"""draftwise pull (fetch models into the cache), calibrate (time forwards of 1..n tokens) and
index (build retrieval datastores for the datastore drafter)."""

from __future__ import annotations

from pathlib import Path

import click

from draftwise import models
from draftwise.calibrate import MAX_N, THOROUGH_REPEATS, cache_file, load_or_measure
from draftwise.cli.common import download_progress, friendly_errors, load_options, model_options, stderr_console
from draftwise.loading import LoadOptions, load_backend


@click.command()
@click.argument("names", nargs=-1)
@friendly_errors
def pull(names: tuple[str, ...]) -> None:
    """Fetch models (default: the target and draft pair) into the cache."""
    with download_progress() as report:
        for name in names or (models.DEFAULT_TARGET, models.DEFAULT_DRAFT):
            path = models.pull(name, report)
            click.echo(f"{name}: {path}", err=True)


@click.command(help=f"Measure (or show the cached) forward cost for n = 1..{MAX_N} new tokens.")
@click.option(
    "--draft", default=models.DEFAULT_DRAFT, show_default=True, help="Draft model to calibrate too ('none' to skip)."
)
@click.option(
    "--thorough", is_flag=True, help=f"Every n in 1..{MAX_N} with {THOROUGH_REPEATS} repeats instead of a quick sample."
)
@click.option("--refresh", is_flag=True, help="Measure again even if a cached curve exists.")
@model_options
@friendly_errors
def calibrate(draft, thorough, refresh, target, backend, n_ctx, threads, dtype, device) -> None:
    from rich.table import Table

    options = load_options(backend, n_ctx, threads, dtype, device)
    names = [target] + ([draft] if draft and draft != "none" else [])
    console = stderr_console()
    for name in names:
        model = load_backend(name, options)
        console.print(f"calibrating {name} ...")
        curve = load_or_measure(model, thorough=thorough, refresh=refresh)
        table = Table(
            title=f"{name}: ms per forward over n new tokens at {curve.context_len} tokens of context",
            caption=f"each 1,000 tokens of context more add {curve.growth_text()} ({cache_file(model)})",
        )
        table.add_column("n", justify="right")
        table.add_column("ms", justify="right")
        table.add_column("ms / token", justify="right")
        for n, ms in curve.points:
            table.add_row(str(n), f"{ms:.1f}", f"{ms / n:.1f}")
        console.print(table)
        model.close()


@click.group()
def index() -> None:
    """Build retrieval datastores for the datastore drafter (--datastore)."""


def _build_index(texts, out, target, max_tokens) -> None:
    from draftwise.drafters.datastore import build_datastore

    console = stderr_console()
    backend = load_backend(target, LoadOptions(n_ctx=256))  # NOTE: keep it alive: its tokenizer uses the model
    meta = build_datastore(
        texts,
        lambda text: backend.tokenizer.encode(text, add_special=False),
        Path(out),
        max_tokens=max_tokens,
        progress=lambda m: console.print(m),
    )
    backend.close()
    console.print(
        f"{out}: {meta['num_docs']} documents, {meta['num_tokens']:,} tokens, "
        f"{meta['bytes'] / 2**20:.1f} MiB; tokenised in {meta['tokenize_s']} s, "
        f"suffix array in {meta['suffix_array_s']} s"
    )


@index.command("build")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--out", required=True, help="Output directory of the datastore.")
@click.option("--target", default=models.DEFAULT_TARGET, show_default=True, help="Model whose tokenizer to use.")
@click.option("--glob", "pattern", default="*", show_default=True, help="File name pattern inside directories.")
@click.option("--max-tokens", type=int, default=None, help="Stop after this many tokens.")
@friendly_errors
def index_build(paths, out, target, pattern, max_tokens) -> None:
    """Tokenise files (or directory trees) into an on-disk suffix array."""

    def texts():
        for raw in paths:
            root = Path(raw)
            files = sorted(p for p in root.rglob(pattern) if p.is_file()) if root.is_dir() else [root]
            for f in files:
                try:
                    yield str(f), f.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue

    _build_index(texts(), out, target, max_tokens)


@index.command("stdlib")
@click.option("--out", required=True, help="Output directory of the datastore.")
@click.option("--target", default=models.DEFAULT_TARGET, show_default=True)
@click.option("--max-tokens", type=int, default=None, help="Stop after this many tokens.")
@friendly_errors
def index_stdlib(out, target, max_tokens) -> None:
    """Recipe: a datastore from this Python's own standard library source (no download)."""
    from draftwise.drafters.datastore import stdlib_sources

    _build_index(stdlib_sources(), out, target, max_tokens)
