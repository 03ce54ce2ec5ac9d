"""draftwise chat without a model process: spans rendered with a style per source, the legend and
the stats line, and a ChatSession on the toy backend (its slash commands, an answer with
speculation off and one drafted from a prediction, coloured on a forced-colour console)."""

import io
import os
import signal
from collections import Counter

import pytest
from click.testing import CliRunner
from rich.console import Console

from draftwise.backends.toy import CharTokenizer, ToyBackend, ToyModel
from draftwise.cli import main
from draftwise.cli.chat import (
    SOURCE_STYLES,
    ChatSession,
    legend,
    printable,
    render_spans,
    run_loop,
    stats_line,
    style_of,
)
from draftwise.drafters import NgramDrafter
from draftwise.drafters.prediction import PredictionDrafter
from draftwise.engine import Engine
from draftwise.metrics import RequestStats
from draftwise.types import SamplingParams, SpeculationConfig, TokenSpan


def span(text, source, step=1):
    return TokenSpan(text=text, source=source, step=step, drafted=0, accepted=0)


def ansi(style: str) -> str:
    """The escape sequence a standard-colour terminal gets for a style."""
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="standard").print("x", style=style, end="")
    return out.getvalue().split("x")[0]


def test_spans_get_their_sources_style():
    text = render_spans([span("def", "target"), span(" f", "ngram"), span("(x)", "prediction"), span("!", "mine")])
    assert text.plain == "def f(x)!"
    styles = [(text.plain[s.start : s.end], str(s.style)) for s in text.spans]
    assert styles == [(" f", "cyan"), ("(x)", "green"), ("!", "underline")]  # the target's text: no style
    assert len({style_of(s) for s in SOURCE_STYLES}) == len(SOURCE_STYLES)  # every source its own


def test_control_characters_are_shown_not_obeyed():
    assert printable("a\x1b[2Jb\tc\nd\re\x7f") == "a\u241b[2Jb\tc\nd\u240de\u2421"
    assert render_spans([span("\x1b[31m", "target")]).plain == "\u241b[31m"


def test_legend_names_each_source_in_its_style():
    text = legend(["target", "ngram", "draft"])
    assert text.plain == "sources:  target  ngram  draft"
    assert {text.plain[s.start : s.end]: str(s.style) for s in text.spans} == {"ngram": "cyan", "draft": "magenta"}


def test_stats_line():
    stats = RequestStats(
        num_generated=30,
        num_drafted=20,
        num_accepted=15,
        num_steps=15,
        decode_ms=100.0,
        estimated_plain_ms=250.0,
        finish_reason="stop",
        tokens_by_source=Counter({"ngram": 15, "target": 15}),
    )
    line = stats_line(stats).plain
    assert line == (
        "[30 tokens, 300.0 tok/s, acceptance 75% of 20 drafted, 2.00 tokens/forward, est. speedup 2.50x; "
        "ngram 15, target 15]"
    )
    stats = RequestStats(
        num_generated=4, num_steps=4, decode_ms=10.0, finish_reason="cancelled", tokens_by_source=Counter(target=4)
    )
    assert stats_line(stats, speculation=False).plain == (
        "[4 tokens, 400.0 tok/s, 0 drafted, 1.00 tokens/forward, speculation off, stopped; target 4]"
    )


@pytest.fixture
def session():
    engine = Engine(
        ToyBackend(ToyModel(vocab_size=40, order=2, seed=5, sharpness=3.0)), [NgramDrafter(1, 3), PredictionDrafter()]
    )
    consoles = [
        Console(
            file=io.StringIO(), force_terminal=True, color_system="standard", width=300, markup=False, highlight=False
        )
        for _ in range(2)
    ]
    sampling = SamplingParams(max_tokens=40, ignore_eos=True)
    return ChatSession(engine, sampling, SpeculationConfig(policy="fixed"), *consoles)


def output(console) -> str:
    text = console.file.getvalue()
    console.file.seek(0)
    console.file.truncate()
    return text


def test_commands(session, tmp_path):
    assert session.command("/system be brief")
    assert session.system == "be brief" and "system message: be brief" in output(session.out)
    assert session.messages("hi") == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    session.command("/system")
    assert session.system is None
    session.command("/spec off")
    assert not session.speculate and "speculation off" in output(session.out)
    session.command("/spec maybe")
    assert "usage: /spec on|off" in output(session.err) and not session.speculate
    session.command("/prediction " + str(tmp_path / "missing.py"))
    assert "cannot read" in output(session.err) and session.prediction is None
    (tmp_path / "p.py").write_text("print(1)\n")
    session.command(f"/prediction {tmp_path / 'p.py'}")
    assert session.prediction == "print(1)\n" and "prediction is" in output(session.out)
    session.history.append({"role": "user", "content": "x"})
    session.command("/reset")
    assert session.history == []
    session.command("/nope")
    assert "unknown command '/nope'" in output(session.err)
    session.command("/help")
    assert "/prediction FILE" in output(session.out)
    assert session.command("/quit") is False


def test_an_answer_drafted_from_a_prediction_is_coloured_as_the_predictions(session, tmp_path):
    session.command("/spec off")
    session.answer("hi")
    plain_answer = session.history[-1]["content"]
    shown = output(session.out)
    assert "0 drafted" in shown and "speculation off" in shown
    assert ansi(style_of("prediction")) not in shown.split("[40 tokens")[0]  # the answer: the target's only

    session.command("/reset")
    session.command("/spec on")
    (tmp_path / "answer.txt").write_text(plain_answer)
    session.command(f"/prediction {tmp_path / 'answer.txt'}")
    output(session.out)
    session.answer("hi")
    assert session.history[-1]["content"] == plain_answer  # a prediction never changes the answer
    assert session.prediction is None  # used once
    shown = output(session.out)
    answer, stats = shown.split("[40 tokens")
    assert ansi(style_of("prediction")) in answer
    assert "prediction" in stats and "acceptance" in stats
    assert len(session.history) == 2


def test_ctrl_c_stops_the_answer_and_the_chat_goes_on(monkeypatch):
    """A SIGINT in the middle of an answer (sent by the model itself as it computes the 21st
    token) stops that answer between steps; the loop then reads the next line. At the prompt,
    Ctrl-C drops the line; end of input leaves."""
    model = ToyModel(vocab_size=40, order=2, seed=5, sharpness=3.0)
    prompt = len("u:hi\na:")  # the toy's chat format
    sent = []

    def logits(context):
        if len(context) == prompt + 20 and not sent:  # the 21st token of the first answer
            sent.append(os.kill(os.getpid(), signal.SIGINT))
        return model.logits(context)

    engine = Engine(ToyBackend(logits_fn=logits, vocab_size=40, tokenizer=CharTokenizer(40)))
    out = Console(file=io.StringIO(), width=300, markup=False, highlight=False)
    session = ChatSession(
        engine, SamplingParams(max_tokens=200, ignore_eos=True), SpeculationConfig(enabled=False), out, out
    )
    lines = iter(["hi", KeyboardInterrupt, "again", EOFError])

    def fake_input(prompt=""):
        line = next(lines)
        if isinstance(line, type):
            raise line
        return line

    monkeypatch.setattr("builtins.input", fake_input)
    before = signal.getsignal(signal.SIGINT)
    run_loop(session)
    assert signal.getsignal(signal.SIGINT) is before  # given back
    shown = output(out)
    assert "stopped" in shown.splitlines()[1] and "(/quit or Ctrl-D to leave)" in shown
    assert len(session.history) == 4  # the stopped answer, as far as it went, and the next one
    assert 0 < len(session.history[1]["content"]) < 200 and len(session.history[3]["content"]) == 200


@pytest.mark.parametrize(
    "args, message",
    [(["--max-tokens", "0"], "max_tokens"), (["--target", "/no/such/model.gguf"], "neither a known name")],
)
def test_bad_arguments_are_one_line_and_status_2(args, message):
    result = CliRunner().invoke(main, ["chat", *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
