"""What every command shares: error handling (a library error is one `error:` line and exit
status 2, never a traceback), the model, policy and constraint options, and progress bars.

Option help and defaults are built from the constants they describe, so they cannot drift.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path

import click

from draftwise import models
from draftwise.backends.hf import DEVICES, DTYPES
from draftwise.drafters.crossvocab import PROMPT_MODES
from draftwise.drafters.stringlevel import DRAFT_LEVELS
from draftwise.errors import BackendError, ConfigError, ModelError, TokenizerMismatchError
from draftwise.loading import BACKENDS, FREE_DRAFTERS, LoadOptions
from draftwise.policy.auto import MAX_K
from draftwise.types import POLICIES, Constraint, SpeculationConfig

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
# The library's errors that mean "a bad argument or a missing model", not a bug.
KNOWN_ERRORS = (ConfigError, ModelError, BackendError, TokenizerMismatchError, FileNotFoundError)

DRAFT_HELP = (
    "Drafters: a draft model (name or path), 'auto' (the one of yours that pays most here, if any), "
    + ", ".join(f"'{name}'" for name in FREE_DRAFTERS)
    + ", 'none', or several comma-separated."
)
DATASTORE_HELP = "A retrieval datastore (draftwise index build) to draft from."


def friendly_errors(fn):
    """Turn the library's specific errors into `error: ...` and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KNOWN_ERRORS as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)

    return wrapper


def _apply(fn, opts):
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


# Where --chat-template and --models-dir keep their values for load_options (click's ctx.meta).
# NOTE: kept out of the commands' parameters, so every command that takes model_options has them
# without a new argument each; load_options is the one reader.
_META_KEYS = {
    "chat_template": "draftwise.chat_template",
    "models_dir": "draftwise.models_dirs",
    "draft_level": "draftwise.draft_level",
    "draft_prompt": "draftwise.draft_prompt",
}


def _keep_in_meta(ctx, param, value):
    ctx.meta[_META_KEYS[param.name]] = value
    return value


def models_dir_option(fn):
    """--models-dir (repeatable): folders of GGUF files to find models in, beside the stores."""
    return click.option(
        "--models-dir",
        multiple=True,
        type=click.Path(file_okay=False),
        expose_value=False,
        callback=_keep_in_meta,
        help="A folder of GGUF files to find models in, beside Ollama's, LM Studio's and the Hugging Face "
        "cache (repeatable).",
    )(fn)


def model_options(fn):
    """Options shared by generate, demo, bench, serve and calibrate: which target, on what."""
    defaults = LoadOptions()
    return _apply(
        fn,
        [
            click.option(
                "--target",
                default=models.DEFAULT_TARGET,
                show_default=True,
                help="Target model: a registry name, a model `draftwise models` lists (Ollama's "
                "qwen2.5-coder:7b, LM Studio's, the Hugging Face cache's), a .gguf file or a transformers directory.",
            ),
            click.option(
                "--chat-template",
                default=None,
                expose_value=False,
                callback=_keep_in_meta,
                help="For a GGUF without one (or instead of its own): a llama.cpp built-in template "
                "(chatml, llama3, gemma, mistral-v7, phi3, ...) or a Jinja file.",
            ),
            models_dir_option,
            click.option(
                "--draft-level",
                type=click.Choice(DRAFT_LEVELS),
                default=defaults.draft_level,
                show_default=True,
                expose_value=False,
                callback=_keep_in_meta,
                help="A draft model of another vocabulary: 'token' (intersection of the vocabularies), 'string' "
                "(its text re-encoded), or 'auto' (string when greedy, else token).",
            ),
            click.option(
                "--draft-prompt",
                type=click.Choice(PROMPT_MODES),
                default=defaults.draft_prompt,
                show_default=True,
                expose_value=False,
                callback=_keep_in_meta,
                help="A draft model of another vocabulary sees the conversation in its own chat template, or "
                "as a plain transcript.",
            ),
            click.option("--backend", type=click.Choice(BACKENDS), default=defaults.backend, show_default=True),
            click.option(
                "--n-ctx", type=int, default=defaults.n_ctx, show_default=True, help="Context window in tokens."
            ),
            click.option("--threads", type=int, default=None, help="CPU threads (default: all available)."),
            click.option("--dtype", default=defaults.dtype, show_default=True, help=f"hf backend: {'|'.join(DTYPES)}."),
            click.option(
                "--device", default=defaults.device, show_default=True, help=f"hf backend: {'|'.join(DEVICES)}."
            ),
        ],
    )


def policy_options(fn):
    """--policy and --k, shared by generate and serve."""
    k = SpeculationConfig().max_draft_tokens
    return _apply(
        fn,
        [
            click.option(
                "--policy", type=click.Choice(POLICIES), default=SpeculationConfig().policy, show_default=True
            ),
            click.option(
                "--k",
                "k",
                type=int,
                default=k,
                show_default=True,
                help=f"Draft tokens per step (fixed) or the starting k (heuristic); auto chooses k in "
                f"0..{MAX_K} itself.",
            ),
        ],
    )


def constraint_options(fn):
    """Structured output: at most one of --json-schema, --json-object, --regex, --grammar."""
    return _apply(
        fn,
        [
            click.option(
                "--json-schema", default=None, help="Constrain the answer to a JSON schema: a file path or inline JSON."
            ),
            click.option("--json-object", is_flag=True, help="Constrain the answer to any JSON object."),
            click.option("--regex", default=None, help="Constrain the answer to a regular expression."),
            click.option(
                "--grammar",
                default=None,
                type=click.Path(dir_okay=False),
                help="Constrain the answer to a grammar file (Lark, or llama.cpp GBNF).",
            ),
        ],
    )


def constraint_from(json_schema, json_object, regex, grammar) -> Constraint | None:
    """The Constraint the options ask for, or None. Raises ConfigError on a bad combination or file."""
    given = [
        name
        for name, value in (
            ("--json-schema", json_schema),
            ("--json-object", json_object),
            ("--regex", regex),
            ("--grammar", grammar),
        )
        if value
    ]
    if len(given) > 1:
        raise ConfigError(f"give one constraint, not {' and '.join(given)}")
    if json_schema is not None:
        text = json_schema
        if not json_schema.lstrip().startswith(("{", "true", "false")):
            path = Path(json_schema)
            if not path.is_file():
                raise ConfigError(f"--json-schema: {json_schema!r} is neither inline JSON nor a file")
            text = path.read_text()
        return Constraint.json_schema(text)
    if json_object:
        return Constraint.json_object()
    if regex is not None:
        return Constraint.regex(regex)
    if grammar is not None:
        return Constraint.grammar(Path(grammar).read_text())
    return None


def models_dirs() -> tuple[str, ...]:
    """--models-dir's folders, from the running command's context."""
    ctx = click.get_current_context(silent=True)
    return tuple(ctx.meta.get(_META_KEYS["models_dir"]) or ()) if ctx is not None else ()


def load_options(backend, n_ctx, threads, dtype, device) -> LoadOptions:
    """The LoadOptions of model_options' values (--chat-template, --models-dir, --draft-level and
    --draft-prompt from the running command's context, where model_options kept them)."""
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    defaults = LoadOptions()
    return LoadOptions(
        backend=backend,
        n_ctx=n_ctx,
        threads=threads,
        dtype=dtype,
        device=device,
        chat_template=meta.get(_META_KEYS["chat_template"]),
        models_dirs=models_dirs(),
        draft_level=meta.get(_META_KEYS["draft_level"]) or defaults.draft_level,
        draft_prompt=meta.get(_META_KEYS["draft_prompt"]) or defaults.draft_prompt,
    )


def csv(kind, allow_same: bool = False):
    """A click callback: '0,0.7' -> (0.0, 0.7); 'same' -> None when allow_same."""

    def parse(ctx, param, value):
        if value is None:
            return None
        out = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            if allow_same and part.lower() in ("same", "none"):
                out.append(None)
                continue
            try:
                out.append(kind(part))
            except ValueError:
                raise click.BadParameter(f"{part!r} is not a valid {kind.__name__}") from None
        if not out:
            raise click.BadParameter("give at least one value")
        return tuple(out)

    return parse


@contextlib.contextmanager
def download_progress():
    """A progress callback for models.pull (one bar per model), stopped on leaving the block."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        transient=False,
        console=stderr_console(),
    )
    tasks: dict[str, int] = {}

    def report(message: str, done: int, total: int) -> None:
        name = message.split(":")[0]
        if name not in tasks:
            bars.start()
            tasks[name] = bars.add_task(message, total=total)
        bars.update(tasks[name], completed=done, description=message)
        if done >= total:
            bars.refresh()

    try:
        yield report
    finally:
        bars.stop()


# What each model's calibration is called on its progress bar.
CALIBRATED_MODELS = {"target": "the target", "draft": "the draft model"}


def calibration_label(model: str, elapsed_s: float, done: int, total: int) -> str:
    """A calibration bar's text: what it measures, and how long it takes (estimated from the
    rounds done so far). Example: ("target", 20, 1, 9) -> "calibrating the target's forward cost
    (first run only, ~3 min)"."""
    who = CALIBRATED_MODELS.get(model, f"drafter {model!r}")
    if done < 1:
        return f"calibrating {who}'s forward cost (first run only)"
    if done >= total:
        return f"calibrated {who}'s forward cost in {format_duration(elapsed_s)} (cached from now on)"
    return f"calibrating {who}'s forward cost (first run only, ~{format_duration(elapsed_s * total / done)})"


def format_duration(seconds: float) -> str:
    """90 -> '2 min'; 40 -> '40 s'."""
    return f"{max(1, round(seconds / 60))} min" if seconds >= 60 else f"{max(1, round(seconds))} s"


@contextlib.contextmanager
def calibration_progress():
    """A loading.CalibrationProgress drawing one bar per model measured (nothing when all are
    cached), stopped on leaving the block."""
    import time

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bars = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=stderr_console())
    tasks: dict[str, tuple[int, float]] = {}

    def report(model: str, done: int, total: int) -> None:
        if model not in tasks:
            bars.start()
            tasks[model] = (bars.add_task("", total=total), time.perf_counter())
        task, t0 = tasks[model]
        bars.update(task, completed=done, description=calibration_label(model, time.perf_counter() - t0, done, total))

    try:
        yield report
    finally:
        bars.stop()


def say_calibrated(calibration) -> None:
    """Once, when the load measured cost curves: how long it took, and that no speed counts it."""
    if calibration.measured:
        click.echo(
            f"note: calibrated {', '.join(CALIBRATED_MODELS.get(m, m) for m in calibration.measured)} in "
            f"{format_duration(calibration.ms / 1000)} (first run only; not counted in any speed below)",
            err=True,
        )


def say_skipped(engine, draft_note: str = "") -> None:
    """The drafters not loaded and why; draft_note: --draft auto's draft and why (Loaded.draft_note)."""
    if draft_note:
        click.echo(f"note: {draft_note}", err=True)
    for name, reason in engine.skipped_drafters.items():
        click.echo(f"note: drafter {name!r} {reason}", err=True)


def stderr_console():
    from rich.console import Console

    return Console(stderr=True)
