"""draftwise chat: a conversation in the terminal, each answer streamed with its tokens coloured
by where they came from (the target's own, a drafter's accepted draft, the grammar's forced
token), and a stats line after it.

The pieces are plain functions a test drives without a model: render_spans (TokenSpans -> a
rich Text styled per source), legend, stats_line, and ChatSession (the conversation, the
slash commands, one answer). The click command loads the pair the way `generate` does and runs
the read-answer loop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from draftwise.cli.common import (
    DATASTORE_HELP,
    DRAFT_HELP,
    KNOWN_ERRORS,
    calibration_progress,
    download_progress,
    friendly_errors,
    load_options,
    model_options,
    policy_options,
    say_calibrated,
    say_skipped,
)
from draftwise.engine import Engine
from draftwise.errors import ConfigError
from draftwise.loading import load, parse_drafters
from draftwise.metrics import RequestStats
from draftwise.types import SamplingParams, SpeculationConfig, TokenSpan

if TYPE_CHECKING:  # rich is imported when a chat starts: other commands never pay for it
    from rich.console import Console
    from rich.text import Text

SAMPLING = SamplingParams()

# The style of each source's text. The target's own tokens keep the terminal's colour, so what
# the drafters got right (and what a constraint forced: grammar) stands out.
SOURCE_STYLES = {
    "target": "",
    "grammar": "yellow",
    "ngram": "cyan",
    "suffix": "bright_blue",
    "datastore": "blue",
    "draft": "magenta",
    "prediction": "green",
    "calls": "bright_red",
}
OTHER_STYLE = "underline"  # a drafter with no colour of its own (a draft model given another name)

# C0 control characters (but tab and newline) and DEL drawn as their Unicode control pictures
# (ESC as U+241B): a model's text never moves the cursor or starts an escape sequence.
_CONTROL_PICTURES = {c: 0x2400 + c for c in range(32) if c not in (9, 10)} | {0x7F: 0x2421}

# What the stats line says of an answer that did not end by itself (EOS or a stop string).
FINISH_NOTES = {"cancelled": "stopped", "length": "max tokens reached"}

COMMANDS = {
    "/prediction FILE": "the next answer's prediction is FILE's text (drafted from where the answer repeats it)",
    "/spec on|off": "speculation on or off (off: the target decodes every token itself)",
    "/system [TEXT]": "set the system message (without TEXT: remove it)",
    "/reset": "clear the conversation",
    "/help": "this list",
    "/quit": "leave (also Ctrl-D); Ctrl-C stops an answer",
}


def style_of(source: str) -> str:
    return SOURCE_STYLES.get(source, OTHER_STYLE)


def printable(text: str) -> str:
    """The text with control characters other than tab and newline shown, not obeyed."""
    return text.translate(_CONTROL_PICTURES)


def render_spans(spans: Iterable[TokenSpan]) -> Text:
    """Example: spans ("def", target), (" f", ngram) -> Text "def f", " f" styled cyan."""
    from rich.text import Text

    text = Text()
    for span in spans:
        text.append(printable(span.text), style=style_of(span.source))
    return text


def legend(sources: Sequence[str]) -> Text:
    """'sources: target ngram prediction', each name in its colour."""
    from rich.text import Text

    text = Text("sources:", style="dim")
    for source in sources:
        text.append("  ")
        text.append(source, style=style_of(source))
    return text


def stats_line(stats: RequestStats, speculation: bool = True) -> Text:
    """After an answer: tokens, tok/s, acceptance, tokens per forward, the estimated speedup
    (when a calibrated curve gave one), and the tokens by source, each source in its colour."""
    from rich.text import Text

    parts = [f"{stats.num_generated} tokens", f"{stats.tokens_per_second:.1f} tok/s"]
    if stats.num_drafted:
        parts.append(f"acceptance {stats.acceptance_rate:.0%} of {stats.num_drafted} drafted")
    else:
        parts.append("0 drafted")
    parts.append(f"{stats.tokens_per_step:.2f} tokens/forward")
    if stats.estimated_speedup:
        parts.append(f"est. speedup {stats.estimated_speedup:.2f}x")
    if not speculation:
        parts.append("speculation off")
    if stats.finish_reason in FINISH_NOTES:
        parts.append(FINISH_NOTES[stats.finish_reason])
    text = Text()
    text.append("[" + ", ".join(parts), style="dim")
    for i, (source, n) in enumerate(stats.tokens_by_source.most_common()):
        text.append("; " if i == 0 else ", ", style="dim")
        text.append(source, style=style_of(source))
        text.append(f" {n}", style="dim")
    text.append("]", style="dim")
    return text


@dataclass
class ChatSession:
    """One conversation: its messages, system message, speculation switch and the prediction
    waiting for the next answer. `out` shows answers and replies; `err` errors and notes."""

    engine: Engine
    sampling: SamplingParams
    speculation: SpeculationConfig
    out: Console
    err: Console
    system: str | None = None
    history: list[dict] = field(default_factory=list)
    speculate: bool = True
    prediction: str | None = None
    _stop: threading.Event | None = None  # set by Ctrl-C while an answer streams

    def messages(self, user: str) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, *self.history, {"role": "user", "content": user}]

    def command(self, line: str) -> bool:
        """Run one slash command; False when it ends the chat."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name == "/quit":
            return False
        if name == "/help":
            for usage, what in COMMANDS.items():
                self.out.print(f"  {usage:<18} {what}")
        elif name == "/reset":
            self.history.clear()
            self.out.print("conversation cleared")
        elif name == "/system":
            self.system = arg or None
            self.out.print(f"system message: {arg}" if arg else "system message removed")
        elif name == "/spec" and arg in ("on", "off"):
            self.speculate = arg == "on"
            self.out.print(f"speculation {arg}")
        elif name == "/prediction" and arg:
            self.set_prediction(arg)
        else:
            usage = next((u for u in COMMANDS if u.split()[0] == name), None)
            self.err.print(f"error: usage: {usage}" if usage else f"error: unknown command {name!r}; /help lists them")
        return True

    def set_prediction(self, path: str) -> None:
        try:
            self.prediction = Path(path).read_text()
        except OSError as exc:
            self.err.print(f"error: /prediction: cannot read {path!r}: {exc.strerror or exc}")
            return
        except UnicodeDecodeError:
            self.err.print(f"error: /prediction: {path!r} is not UTF-8 text")
            return
        note = "" if self.speculate else " (speculation is off: /spec on to draft from it)"
        self.out.print(f"the next answer's prediction is {path} ({len(self.prediction)} characters){note}")

    def interrupt(self, signum=None, frame=None) -> None:
        """The SIGINT handler: Ctrl-C stops the answer being streamed (between steps: the engine
        stays ready) and, at the prompt, interrupts the input."""
        if self._stop is None:
            raise KeyboardInterrupt
        self._stop.set()

    def answer(self, user: str) -> None:
        """Stream the answer to `user`, coloured by source, then its stats line. An answer
        stopped by Ctrl-C stays in the conversation as far as it went (unless it had not begun)."""
        prediction, self.prediction = self.prediction, None
        speculation = self.speculation if self.speculate else replace(self.speculation, enabled=False)
        messages = self.messages(user)
        self._stop = threading.Event()
        try:
            gen = self.engine.stream(
                messages=messages,
                sampling=self.sampling,
                speculation=speculation,
                prediction=prediction,
                token_sources=True,
                cancelled=self._stop.is_set,
            )
            shown = 0
            for _ in gen:
                self.out.print(render_spans(gen.spans[shown:]), end="", soft_wrap=True)
                shown = len(gen.spans)
            result = gen.result
            if result.text or result.stats.finish_reason != "cancelled":  # stopped before a word: forgotten
                self.history += [messages[-1], {"role": "assistant", "content": result.text}]
            self.out.print()
            self.out.print(stats_line(result.stats, speculation.enabled), soft_wrap=True)
        finally:
            self._stop = None


def run_loop(session: ChatSession) -> None:
    """Read lines until /quit or end of input; a line is a command or the next user message.
    Ctrl-C stops an answer, or drops the line being typed: the chat goes on."""
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input(), where the platform has it)
    previous = signal.signal(signal.SIGINT, session.interrupt)
    try:
        while True:
            try:
                if not handle(session, session.out.input("> ").strip()):
                    return
            except EOFError:
                session.out.print()
                return
            except KeyboardInterrupt:
                session.out.print("\n(/quit or Ctrl-D to leave)", style="dim")
    finally:
        signal.signal(signal.SIGINT, previous)


def handle(session: ChatSession, line: str) -> bool:
    """One line read: a command, or the next user message; False when the chat ends."""
    if line.startswith("/"):
        return session.command(line)
    if line:
        try:
            session.answer(line)
        except KNOWN_ERRORS as exc:  # a prompt past the context, say
            session.err.print(f"\nerror: {exc}")
    return True


@click.command()
@click.option("--system", default=None, help="System message.")
@click.option("--draft", default="ngram", show_default=True, help=DRAFT_HELP + " 'prediction' is always added.")
@policy_options
@click.option("--max-tokens", type=int, default=SAMPLING.max_tokens, show_default=True, help="Per answer.")
@click.option("--temperature", type=float, default=SAMPLING.temperature, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=float, default=SAMPLING.top_p, show_default=True)
@click.option("--top-k", type=int, default=SAMPLING.top_k, show_default=True)
@click.option("--min-p", type=float, default=SAMPLING.min_p, show_default=True)
@click.option(
    "--draft-temperature", type=float, default=None, help="Drafter's own temperature (default: the target's)."
)
@click.option("--seed", type=int, default=None)
@click.option("--datastore", default=None, help=DATASTORE_HELP)
@click.option("--no-color", is_flag=True, help="Plain text, no colours (also when NO_COLOR is set).")
@model_options
@friendly_errors
def chat(
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
    datastore,
    no_color,
    target,
    backend,
    n_ctx,
    threads,
    dtype,
    device,
) -> None:
    """Chat in the terminal, each token coloured by the drafter (or the target) that wrote it."""
    if max_tokens < 1:  # max_tokens 0 scores a prompt: a chat has nothing to show for it
        raise ConfigError(f"max_tokens must be >= 1, got {max_tokens}")
    sampling = SamplingParams(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, max_tokens=max_tokens
    )
    names = parse_drafters(draft)
    if "prediction" not in names:  # /prediction needs its drafter; without a prediction it drafts nothing
        names.append("prediction")
    speculation = SpeculationConfig(policy=policy, max_draft_tokens=k, draft_temperature=draft_temperature)
    with download_progress() as report, calibration_progress() as calibrating:
        loaded = load(
            target,
            ",".join(names),
            options=load_options(backend, n_ctx, threads, dtype, device),
            speculation=speculation,
            progress=report,
            datastore=datastore,
            calibration_progress=calibrating,
        )
    from rich.console import Console

    engine = loaded.engine
    say_skipped(engine, loaded.draft_note)
    say_calibrated(loaded.calibration)
    plain = no_color or bool(os.environ.get("NO_COLOR"))
    # color_system None: no escape codes at all (rich's own NO_COLOR handling keeps bold and the
    # like). No markup either: a user's text or path with [brackets] prints as it is.
    colour = {"color_system": None} if plain else {}
    out = Console(markup=False, highlight=False, **colour)
    err = Console(stderr=True, markup=False, highlight=False, **colour)
    session = ChatSession(engine, sampling, speculation, out, err, system=system)
    drafters = [d.name for d in engine.drafters]
    out.print(f"draftwise chat: {target}; drafters {', '.join(drafters)}; policy {policy}. /help lists the commands.")
    if plain:
        out.print("colours off: the stats line after each answer counts the tokens by source", style="dim")
    else:
        out.print(legend(list(dict.fromkeys(["target", *drafters]))))
    run_loop(session)
