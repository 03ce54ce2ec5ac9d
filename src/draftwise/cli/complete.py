"""draftwise complete FILE --line L --column C: fill in the middle at a cursor, as an editor asks
/infill, and print the middle (with --json: one object with the middle, llama.cpp-style timings
and the request's metrics). The prompt is the one /infill builds, cut as it cuts it."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import click

from draftwise.cli.common import (
    DRAFT_HELP,
    calibration_progress,
    download_progress,
    friendly_errors,
    load_options,
    model_options,
    policy_options,
    say_calibrated,
    say_skipped,
)
from draftwise.errors import ConfigError
from draftwise.fim import FimBudget, fim_prompt, require_fim_tokens, split_at
from draftwise.loading import load
from draftwise.types import SamplingParams, SpeculationConfig

# llama.vim's and llama.vscode's n_predict: a completion is a few lines.
MAX_TOKENS = 128


def read_text(path: str) -> str:
    """A source file as text ('-': stdin); a file that is not UTF-8 is a ConfigError naming it."""
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--line", type=int, required=True, help="The cursor's line, 1-based.")
@click.option(
    "--column", type=int, required=True, help="The cursor's column in characters, 1-based (line length + 1: its end)."
)
@click.option(
    "--extra",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Another file the model sees as context, before FILE (repeatable; /infill's input_extra).",
)
@click.option("--draft", default="ngram", show_default=True, help=DRAFT_HELP)
@policy_options
@click.option("--max-tokens", type=int, default=MAX_TOKENS, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: the middle, timings and metrics.")
@model_options
@friendly_errors
def complete(
    file,
    line,
    column,
    extra,
    draft,
    policy,
    k,
    max_tokens,
    temperature,
    seed,
    stop,
    as_json,
    target,
    backend,
    n_ctx,
    threads,
    dtype,
    device,
) -> None:
    """Fill in the middle of FILE at --line/--column (a FIM-trained target) and print the middle."""
    if max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, got {max_tokens}")
    prefix, suffix = split_at(read_text(file), line, column)  # bad input fails before a model loads
    extra_chunks = [(Path(path).name, read_text(path)) for path in extra]
    sampling = SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens, stop=tuple(stop))
    speculation = SpeculationConfig(policy=policy, max_draft_tokens=k)
    with download_progress() as report, calibration_progress() as calibrating:
        loaded = load(
            target,
            draft,
            options=load_options(backend, n_ctx, threads, dtype, device),
            speculation=speculation,
            progress=report,
            calibration_progress=calibrating,
        )
    engine = loaded.engine
    say_skipped(engine, loaded.draft_note)
    if not as_json:
        say_calibrated(loaded.calibration)
    built = fim_prompt(
        engine.tokenizer,
        prefix,
        suffix,
        extra=extra_chunks,
        tokens=require_fim_tokens(engine.tokenizer),
        budget=FimBudget(n_ctx=engine.target.n_ctx, n_predict=max_tokens),
    )
    room = engine.target.n_ctx - len(built.ids)
    result = engine.generate(
        prompt_ids=built.ids,
        sampling=replace(sampling, max_tokens=max(1, min(max_tokens, room))),
        speculation=speculation,
    )
    if not as_json:
        click.echo(result.text, nl=False)
        return
    s = result.stats
    predicted = s.num_generated + s.num_eos  # as /infill's and llama.cpp's: the EOS that ended it counts
    timings = {
        "prompt_n": s.num_prompt_tokens - s.num_reused_tokens,
        "prompt_ms": s.prefill_ms,
        "predicted_n": predicted,
        "predicted_ms": s.decode_ms,
        "predicted_per_second": 1000.0 * predicted / s.decode_ms if s.decode_ms > 0 else 0.0,
    }
    cuts = {
        "num_prefix_dropped": built.num_prefix_dropped,
        "num_suffix_dropped": built.num_suffix_dropped,
        "num_extra_dropped": built.num_extra_dropped,
    }
    click.echo(json.dumps({**result.to_dict(), "timings": timings, **cuts, "calibration_ms": loaded.calibration.ms}))
