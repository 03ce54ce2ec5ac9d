"""Command line: draftwise pull | generate | demo | calibrate | bench | serve.

A thin client of the public API. Bad arguments end with a one-line message and a
non-zero exit status, never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys

import click

from draftwise import models
from draftwise.types import SamplingParams, SpeculationConfig

EXIT_USAGE = 2


def _known_errors() -> tuple[type[BaseException], ...]:
    from draftwise.backends.base import BackendError
    from draftwise.engine import TokenizerMismatchError
    from draftwise.models import ModelError
    from draftwise.types import ConfigError

    return (ConfigError, ModelError, BackendError, TokenizerMismatchError, FileNotFoundError)


def friendly_errors(fn):
    """Turn the library's specific errors into `error: ...` and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _known_errors() as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def _progress_printer():
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    bars = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    transient=False, console=_stderr_console())
    tasks: dict[str, int] = {}

    def report(message: str, done: int, total: int) -> None:
        name = message.split(":")[0]
        if name not in tasks:
            bars.start()
            tasks[name] = bars.add_task(message, total=total)
        bars.update(tasks[name], completed=done, description=message)
        if done >= total:
            bars.refresh()

    report.bars = bars
    return report


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


@click.group()
@click.version_option(package_name="draftwise")
def main() -> None:
    """draftwise: lossless speculative decoding for local LLMs."""


@main.command()
@click.argument("names", nargs=-1)
@friendly_errors
def pull(names: tuple[str, ...]) -> None:
    """Fetch models (default: the target and draft pair) into the cache."""
    report = _progress_printer()
    try:
        for name in names or (models.DEFAULT_TARGET, models.DEFAULT_DRAFT):
            path = models.pull(name, report)
            click.echo(f"{name}: {path}", err=True)
    finally:
        report.bars.stop()


def model_options(fn):
    """Options shared by generate, demo, bench and serve."""
    opts = [
        click.option("--target", default=models.DEFAULT_TARGET, show_default=True,
                     help="Target model: a registry name, a .gguf file or a transformers directory."),
        click.option("--backend", type=click.Choice(["auto", "llamacpp", "hf"]), default="auto", show_default=True),
        click.option("--n-ctx", type=int, default=4096, show_default=True, help="Context window in tokens."),
        click.option("--threads", type=int, default=None, help="CPU threads (default: all available)."),
        click.option("--dtype", default="float32", show_default=True, help="hf backend: float32|bfloat16|float16|float64."),
        click.option("--device", default="cpu", show_default=True, help="hf backend: cpu|cuda|auto."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _load_options(backend, n_ctx, threads, dtype, device):
    from draftwise.loading import LoadOptions

    return LoadOptions(backend=backend, n_ctx=n_ctx, threads=threads, dtype=dtype, device=device)


@main.command()
@click.option("--prompt", required=True, help="The prompt text (with --chat: the user message).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--system", default=None, help="System message for --chat.")
@click.option("--draft", default="ngram", show_default=True,
              help="Drafters: a draft model (name or path), 'ngram', 'none', or several comma-separated.")
@click.option("--policy", type=click.Choice(["auto", "fixed", "heuristic"]), default="auto", show_default=True)
@click.option("--k", "k", type=int, default=4, show_default=True, help="Draft tokens per step (fixed), start/max (others).")
@click.option("--max-tokens", type=int, default=256, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True)
@click.option("--min-p", type=float, default=0.0, show_default=True)
@click.option("--draft-temperature", type=float, default=None, help="Drafter's own temperature (default: the target's).")
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, token_ids and metrics.")
@model_options
@friendly_errors
def generate(prompt, chat, system, draft, policy, k, max_tokens, temperature, top_p, top_k, min_p,
             draft_temperature, seed, stop, as_json, target, backend, n_ctx, threads, dtype, device) -> None:
    """Generate text with speculative decoding, streaming it to the terminal."""
    from draftwise.loading import load_engine

    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                              max_tokens=max_tokens, stop=tuple(stop))
    speculation = SpeculationConfig(policy=policy, max_draft_tokens=k, draft_temperature=draft_temperature)
    options = _load_options(backend, n_ctx, threads, dtype, device)
    report = _progress_printer()
    try:
        engine = load_engine(target, draft, options=options, speculation=speculation, progress=report)
    finally:
        report.bars.stop()
    messages = None
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    gen = engine.stream(None if chat else prompt, messages=messages, sampling=sampling, speculation=speculation)
    for piece in gen:
        if not as_json:
            click.echo(piece, nl=False)
            sys.stdout.flush()
    result = gen.result
    if as_json:
        click.echo(json.dumps(result.to_dict()))
        return
    s = result.stats
    click.echo("")
    click.echo(
        f"[{s.num_generated} tokens, {s.tokens_per_second:.1f} tok/s decode, {s.tokens_per_second_e2e:.1f} tok/s "
        f"end-to-end, acceptance {s.acceptance_rate:.0%} ({s.num_accepted}/{s.num_drafted}), "
        f"{s.tokens_per_step:.2f} tokens/step, finish: {s.finish_reason}]",
        err=True,
    )


@main.command()
@click.option("--prompt", default="Rewrite this function with type hints and a docstring, changing nothing else:\n\n"
              "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
              "        if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n        else:\n"
              "            out.append(b[j])\n            j += 1\n    out.extend(a[i:])\n    out.extend(b[j:])\n"
              "    return out\n", show_default=False, help="User message (chat template applied).")
@click.option("--max-tokens", type=int, default=192, show_default=True)
@click.option("--draft-model", default=models.DEFAULT_DRAFT, show_default=True)
@model_options
@friendly_errors
def demo(prompt, max_tokens, draft_model, target, backend, n_ctx, threads, dtype, device) -> None:
    """Same prompt, greedy: plain decoding vs n-gram vs draft model vs auto; prints the speeds."""
    from rich.table import Table

    from draftwise.loading import load_engine

    options = _load_options(backend, n_ctx, threads, dtype, device)
    report = _progress_printer()
    try:
        engine = load_engine(target, f"ngram,{draft_model}", options=options, progress=report)
    finally:
        report.bars.stop()
    messages = [{"role": "user", "content": prompt}]
    sampling = SamplingParams(max_tokens=max_tokens)
    runs = [
        ("plain", (), SpeculationConfig(enabled=False)),
        ("ngram (fixed k=8)", ("ngram",), SpeculationConfig(policy="fixed", max_draft_tokens=8)),
        ("draft model (fixed k=4)", ("draft",), SpeculationConfig(policy="fixed", max_draft_tokens=4)),
        ("auto (both drafters)", ("ngram", "draft"), SpeculationConfig(policy="auto")),
    ]
    console = _stderr_console()
    table = Table(title=f"{target}, greedy, {max_tokens} tokens")
    for col in ("method", "tok/s", "speedup", "acceptance", "tokens/step", "same text"):
        table.add_column(col, justify="right")
    base_tps, base_ids = None, None
    engine.generate(messages=messages, sampling=SamplingParams(max_tokens=8))  # warm-up
    for label, drafter_list, spec in runs:
        console.print(f"[bold]{label}[/bold] ...")
        result = engine.generate(messages=messages, sampling=sampling, speculation=spec, drafters=drafter_list)
        s = result.stats
        if base_tps is None:
            base_tps, base_ids = s.tokens_per_second, result.token_ids
            click.echo(result.text)
        table.add_row(label, f"{s.tokens_per_second:.1f}", f"{s.tokens_per_second / base_tps:.2f}x",
                      f"{s.acceptance_rate:.0%}" if s.num_drafted else "-", f"{s.tokens_per_step:.2f}",
                      "yes" if result.token_ids == base_ids else "no")
    console.print(table)


@main.command()
@click.option("--draft", default="ngram", show_default=True,
              help="Drafters: a draft model (name or path), 'ngram', 'none', or several comma-separated.")
@click.option("--policy", type=click.Choice(["auto", "fixed", "heuristic"]), default="auto", show_default=True)
@click.option("--k", "k", type=int, default=4, show_default=True, help="Draft tokens per step (fixed), start/max (others).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (loopback unless told otherwise).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' on every route but /health.")
@click.option("--model-name", default=None, help="Name clients use as `model` (default: the target's name).")
@model_options
@friendly_errors
def serve(draft, policy, k, host, port, api_key, model_name, target, backend, n_ctx, threads, dtype, device) -> None:
    """Serve the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics)."""
    import logging

    import uvicorn

    from draftwise.loading import load_engine
    from draftwise.server import create_app

    speculation = SpeculationConfig(policy=policy, max_draft_tokens=k)
    options = _load_options(backend, n_ctx, threads, dtype, device)
    report = _progress_printer()
    try:
        engine = load_engine(target, draft, options=options, speculation=speculation, progress=report)
    finally:
        report.bars.stop()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    if api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: serving on {host} without --api-key; anyone who can reach it can use it", err=True)
    app = create_app(engine, model_name or engine.target.name, api_key=api_key)
    uvicorn.run(app, host=host, port=port, log_level="info")


def run() -> None:
    main()


if __name__ == "__main__":
    main()
