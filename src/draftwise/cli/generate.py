"""draftwise generate (one prompt, streamed) and draftwise demo (plain vs n-gram vs draft model
vs auto on new code and on an edit, with the speeds side by side)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import click

from draftwise import models
from draftwise.cli.common import (
    DATASTORE_HELP,
    DRAFT_HELP,
    calibration_progress,
    constraint_from,
    constraint_options,
    download_progress,
    friendly_errors,
    load_options,
    model_options,
    policy_options,
    say_calibrated,
    say_skipped,
    stderr_console,
)
from draftwise.errors import ConfigError
from draftwise.loading import load, parse_drafters
from draftwise.types import SamplingParams, SpeculationConfig

SAMPLING = SamplingParams()

DEMO_PROMPT = (
    "Rewrite this function with type hints and a docstring, changing nothing else:\n\n"
    "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n        else:\n"
    "            out.append(b[j])\n            j += 1\n    out.extend(a[i:])\n    out.extend(b[j:])\n"
    "    return out\n"
)
# The demo's second prompt: an edit whose answer mostly repeats code in the prompt, where prompt
# lookup pays on any host (the first is mostly new text: the lookups find little to copy and
# the draft model pays only where a many-row forward is cheap).
DEMO_EDIT_PROMPT = (
    "Rename the method `push` to `append` everywhere in this class. Reply with the whole class "
    "and nothing else.\n\n"
    "class Stack:\n"
    '    """A stack of items with a size limit."""\n\n'
    "    def __init__(self, limit=100):\n        self.items = []\n        self.limit = limit\n\n"
    "    def push(self, item):\n        if len(self.items) >= self.limit:\n"
    '            raise OverflowError("the stack is full")\n        self.items.append(item)\n\n'
    "    def push_all(self, items):\n        for item in items:\n            self.push(item)\n\n"
    "    def pop(self):\n        if not self.items:\n"
    '            raise IndexError("pop from an empty stack")\n        return self.items.pop()\n\n'
    "    def peek(self):\n        return self.items[-1] if self.items else None\n\n"
    "    def __len__(self):\n        return len(self.items)\n"
)
# (title, prompt) of the demo's prompts when --prompt is not given.
DEMO_PROMPTS = (("new code", DEMO_PROMPT), ("an edit of code in the prompt", DEMO_EDIT_PROMPT))

# (label, drafters, speculation) of the demo's timed runs, plain first: the others' speedup is over it.
DEMO_RUNS = (
    ("plain", (), SpeculationConfig(enabled=False)),
    ("ngram k=8", ("ngram",), SpeculationConfig(policy="fixed", max_draft_tokens=8)),
    ("draft k=4", ("draft",), SpeculationConfig(policy="fixed", max_draft_tokens=4)),
    ("auto", ("ngram", "draft"), SpeculationConfig(policy="auto")),
)
WARMUP_TOKENS = 8  # per run of the demo's warm-up


@click.command()
@click.option("--prompt", required=True, help="The prompt text (with --chat: the user message).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--system", default=None, help="System message for --chat.")
@click.option("--draft", default="ngram", show_default=True, help=DRAFT_HELP)
@policy_options
@click.option("--max-tokens", type=int, default=SAMPLING.max_tokens, show_default=True)
@click.option("--temperature", type=float, default=SAMPLING.temperature, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=float, default=SAMPLING.top_p, show_default=True)
@click.option("--top-k", type=int, default=SAMPLING.top_k, show_default=True)
@click.option("--min-p", type=float, default=SAMPLING.min_p, show_default=True)
@click.option(
    "--draft-temperature", type=float, default=None, help="Drafter's own temperature (default: the target's)."
)
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, token_ids and metrics.")
@click.option("--datastore", default=None, help=DATASTORE_HELP)
@click.option(
    "--branches",
    type=int,
    default=1,
    show_default=True,
    help="Token trees: verify up to N n-gram continuations per step (greedy, fixed policy).",
)
@click.option(
    "--prediction",
    "prediction_file",
    default=None,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="The expected output (a file, or - for stdin), e.g. the file being edited: drafted from.",
)
@constraint_options
@model_options
@friendly_errors
def generate(
    prompt,
    chat,
    system,
    draft,
    policy,
    k,
    max_tokens,
    temperature,
    top_p,
    top_k,
    min_p,
    draft_temperature,
    seed,
    stop,
    as_json,
    datastore,
    branches,
    prediction_file,
    json_schema,
    json_object,
    regex,
    grammar,
    target,
    backend,
    n_ctx,
    threads,
    dtype,
    device,
) -> None:
    """Generate text with speculative decoding, streaming it to the terminal."""
    if max_tokens < 1:  # the API's max_tokens 0 scores a prompt; generate has nothing to show for it
        raise ConfigError(f"max_tokens must be >= 1, got {max_tokens}")
    prediction = None
    if prediction_file is not None:
        prediction = sys.stdin.read() if prediction_file == "-" else Path(prediction_file).read_text()
        names = parse_drafters(draft)
        if "prediction" not in names:  # a prediction needs its drafter
            draft = ",".join([*names, "prediction"])

    sampling = SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seed=seed,
        max_tokens=max_tokens,
        stop=tuple(stop),
        constraint=constraint_from(json_schema, json_object, regex, grammar),
    )
    speculation = SpeculationConfig(
        policy=policy, max_draft_tokens=k, draft_temperature=draft_temperature, max_branches=branches
    )
    options = replace(load_options(backend, n_ctx, threads, dtype, device), n_seq_max=branches)
    # Calibration (the auto policy's, first run only) happens here, before anything is timed.
    with download_progress() as report, calibration_progress() as calibrating:
        loaded = load(
            target,
            draft,
            options=options,
            speculation=speculation,
            progress=report,
            datastore=datastore,
            calibration_progress=calibrating,
        )
    engine = loaded.engine
    say_skipped(engine, loaded.draft_note)
    if not as_json:
        say_calibrated(loaded.calibration)
    messages = None
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    gen = engine.stream(
        None if chat else prompt, messages=messages, sampling=sampling, speculation=speculation, prediction=prediction
    )
    for piece in gen:
        if not as_json:
            click.echo(piece, nl=False)
            sys.stdout.flush()
    result = gen.result
    if as_json:
        # calibration_ms: measuring the cost curves before the request (0 when they were cached),
        # never part of the request's timings.
        click.echo(json.dumps({**result.to_dict(), "calibration_ms": loaded.calibration.ms}))
        return
    s = result.stats
    click.echo("")
    click.echo(
        f"[{s.num_generated} tokens, {s.tokens_per_second:.1f} tok/s decode, {s.tokens_per_second_e2e:.1f} tok/s "
        f"end-to-end, acceptance {s.acceptance_rate:.0%} ({s.num_accepted}/{s.num_drafted}), "
        f"{s.tokens_per_step:.2f} tokens/step, finish: {s.finish_reason}]",
        err=True,
    )


@click.command()
@click.option(
    "--prompt",
    default=None,
    help="User message (chat template applied); default: two prompts, new code and an edit of code in the prompt.",
)
@click.option("--max-tokens", type=int, default=192, show_default=True)
@click.option("--draft-model", default=models.DEFAULT_DRAFT, show_default=True)
@model_options
@friendly_errors
def demo(prompt, max_tokens, draft_model, target, backend, n_ctx, threads, dtype, device) -> None:
    """Same prompt, greedy: plain decoding vs n-gram vs draft model vs auto; prints the speeds.
    Without --prompt, two prompts: new code (where the lookups find little to copy) and an edit
    of code in the prompt (where they pay), each with its own table."""
    options = load_options(backend, n_ctx, threads, dtype, device)
    with download_progress() as report, calibration_progress() as calibrating:
        # The demo shows the draft model at fixed k too, so it is loaded whether or not it can pay
        # here; its auto run is priced by a calibration made now, before any run is timed.
        loaded = load(
            target,
            f"ngram,{draft_model}",
            options=options,
            progress=report,
            speculation=SpeculationConfig(policy="fixed"),
            calibrate=True,
            calibration_progress=calibrating,
        )
    engine = loaded.engine
    say_calibrated(loaded.calibration)
    console = stderr_console()
    for title, text in (("your prompt", prompt),) if prompt is not None else DEMO_PROMPTS:
        console.print(demo_table(engine, console, f"{target}, {title}, greedy, {max_tokens} tokens", text, max_tokens))


def demo_table(engine, console, title: str, prompt: str, max_tokens: int):
    """The demo's runs (DEMO_RUNS) on one prompt, timed after an untimed warm-up: a rich Table of
    each run's speed over plain decoding's, its acceptance and whether its text is plain's."""
    from rich.table import Table

    messages = [{"role": "user", "content": prompt}]
    sampling = SamplingParams(max_tokens=max_tokens)
    # Short headers and a legend: the table fits an 80-column terminal.
    table = Table(
        title=title,
        caption="speedup: tok/s over plain; acc.: draft tokens accepted; tok/step: tokens per target "
        "forward; same: text identical to plain. ngram: prompt lookup, draft: the draft model, "
        "both at fixed k; auto: the cost model picks drafter and k per step.",
    )
    for col in ("method", "tok/s", "speedup", "acc.", "tok/step", "same"):
        table.add_column(col, justify="right", no_wrap=True)
    base_tps, base_ids = None, None
    console.print(f"{title}: warming up ...")
    demo_warmup(engine, messages)
    for label, drafter_list, spec in DEMO_RUNS:
        console.print(f"[bold]{label}[/bold] ...")
        result = engine.generate(messages=messages, sampling=sampling, speculation=spec, drafters=drafter_list)
        s = result.stats
        if base_tps is None:
            base_tps, base_ids = s.tokens_per_second, result.token_ids
            click.echo(result.text)
        table.add_row(
            label,
            f"{s.tokens_per_second:.1f}",
            f"{s.tokens_per_second / base_tps:.2f}x",
            f"{s.acceptance_rate:.0%}" if s.num_drafted else "-",
            f"{s.tokens_per_step:.2f}",
            "yes" if result.token_ids == base_ids else "no",
        )
    return table


def demo_warmup(engine, messages) -> None:
    """Each run's set-up once, untimed, on the demo's prompt: the prompt is read and cached, both
    models' weights are paged in by a forward, and each run's policy is made (the auto one reads
    the calibrated curves). The first timed run then decodes as fast as a second would."""
    for _, drafter_list, spec in DEMO_RUNS:
        engine.generate(
            messages=messages,
            sampling=SamplingParams(max_tokens=WARMUP_TOKENS),
            speculation=spec,
            drafters=drafter_list,
        )
