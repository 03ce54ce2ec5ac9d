"""draftwise models (the models the user has, in every store: draftwise.stores), pull (fetch
models into the cache), calibrate (time forwards of 1..n tokens) and index (build retrieval
datastores for the datastore drafter)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from draftwise import models
from draftwise.calibrate import MAX_N, THOROUGH_REPEATS, cache_file, load_or_measure
from draftwise.cli.common import (
    download_progress,
    friendly_errors,
    load_options,
    model_options,
    models_dir_option,
    models_dirs,
    stderr_console,
)
from draftwise.loading import LoadOptions, load_backend

COLUMNS = (
    "name",
    "store",
    "family",
    "params",
    "quant",
    "size",
    "vocab",
    "context",
    "template",
    "tools",
    "FIM",
    "drafts",
)
NUMERIC_COLUMNS = ("params", "size", "vocab", "context")


def format_count(n: int) -> str:
    """1_543_714_304 -> '1.54B'; 494_032_768 -> '494M'; 12_345 -> '12.3K'."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.2f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def format_bytes(n: int) -> str:
    """1_117_320_768 -> '1.04 GiB'; 491_400_064 -> '469 MiB'."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"


def _registry_rows(found) -> list[dict]:
    """The registry's models not in the cache yet (draftwise pull fetches them)."""
    cached = {m.name for m in found if m.store == "draftwise"}
    return [
        {"name": name, "store": "registry", "size_bytes": spec.size, "pulled": False}
        for name, spec in models.REGISTRY.items()
        if name not in cached
    ]


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: models, skipped files, folders searched.")
@models_dir_option
@friendly_errors
def list_models(as_json: bool) -> None:
    """The models you have: draftwise's cache, Ollama's and LM Studio's stores, the Hugging Face
    and llama.cpp caches, and --models-dir folders, each read in place. --target takes their names."""
    from draftwise.pairing import compatible_drafts
    from draftwise.stores import StoreRoots, discover

    found = discover(StoreRoots.from_environment(models_dirs()))
    drafts = compatible_drafts(found.models)
    rows = [m.as_json() for m in found.models] + _registry_rows(found.models)
    for row in rows:
        if row["name"] in drafts:
            row["drafts"] = [{"name": d.name, "same_vocabulary": d.same_vocabulary} for d in drafts[row["name"]]]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "models": rows,
                    "skipped": [{"path": str(s.path), "reason": s.reason} for s in found.skipped],
                    "searched": [{"store": store, "path": str(path)} for store, path in found.searched],
                },
                indent=2,
            )
        )
        return
    _print_table(rows, found)


def _drafts_text(drafts) -> str:
    """The models that could draft for a row's: those of another vocabulary marked (cross-vocabulary).
    Example: [{"name": "a", "same_vocabulary": True}, {"name": "b", ...False}] -> "a, b (cross)"."""
    return ", ".join(d["name"] + ("" if d["same_vocabulary"] else " (cross)") for d in drafts) or "-"


def _print_table(rows: list[dict], found) -> None:
    """The table, then the models that cannot be used and the files skipped. Every text is
    escaped: a file's name or header is no rich markup ('a[/b]/x.gguf' would stop the listing)."""
    import sys

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="models (--target takes a name)")
    for column in COLUMNS:
        table.add_column(
            column, overflow="fold", no_wrap=column == "name", justify="right" if column in NUMERIC_COLUMNS else "left"
        )
    for row in rows:
        if row["store"] == "registry":
            note = f"not pulled yet (draftwise pull {row['name']})"
            table.add_row(row["name"], row["store"], note, "", "", format_bytes(row["size_bytes"]), *[""] * 6)
            continue
        if "problem" in row:
            continue  # listed under the table: the message names the file
        cells = (
            row["name"],
            row["store"],
            row["architecture"],
            row["size_label"] or format_count(row["num_params"]),
            row["quantisation"],
            format_bytes(row["size_bytes"]),
            str(row["vocab_size"] or "?"),
            str(row["context_length"] or "?"),
            row["chat_template"],
            row["tool_format"] or "-",
            "yes" if row["fim"] else "-",
            _drafts_text(row.get("drafts", ())),
        )
        table.add_row(*(escape(cell) for cell in cells))
    console = Console(width=None if sys.stdout.isatty() else 400)  # piped: a line a model, unfolded
    console.print(table)
    for row in rows:
        if "problem" in row:
            text = escape(f"{row['name']} ({row['store']}): {row['problem']}")
            console.print(f"[red]cannot use[/red] {text}", soft_wrap=True)
    for skipped in found.skipped:
        console.print(escape(f"skipped {skipped.path}: {skipped.reason}"), soft_wrap=True)
    if not found.searched:
        console.print("no store found (looked for Ollama, LM Studio, the Hugging Face and llama.cpp caches)")


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
