"""`draftwise chat` through a pseudo-terminal (pexpect) on tiny random GGUF models (llama.cpp):
answers and their stats lines, /spec off, /prediction with a file and with a missing one,
/reset, /system, /help, Ctrl-C, /quit and Ctrl-D; in colour, the tokens drafted from a
prediction carry the prediction's colour and the target's none; with --no-color, no colour
codes at all."""

import io
import json
import os
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from draftwise.cli import main
from draftwise.cli.chat import style_of

pexpect = pytest.importorskip("pexpect")

SRC = Path(__file__).resolve().parents[2] / "src"
STATS = r"\[\d+ tokens, [^\r\n]*\]"  # the stats line after an answer
SGR = re.compile(r"\x1b\[[0-9;]*m")  # a colour or style escape sequence


def model_args(tiny_gguf_dir) -> list[str]:
    return ["--target", str(tiny_gguf_dir / "target.gguf"), "--n-ctx", "512", "--threads", "1", "--temperature", "0"]


def spawn(tiny_gguf_dir, *args, colour: bool = True, max_tokens: int = 16):
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")}
    env.update(PYTHONPATH=os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]), TERM="xterm-256color")
    if colour:
        env["FORCE_COLOR"] = "1"
    chat = ["chat", *model_args(tiny_gguf_dir), "--policy", "fixed", "--max-tokens", str(max_tokens), *args]
    child = pexpect.spawn(
        sys.executable,
        ["-m", "draftwise.cli", *chat],
        env=env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(50, 250),
        timeout=120,
    )
    child.expect("/help lists the commands")
    child.expect("\n> ")
    return child


def say(child, line: str) -> str:
    """Send a command; what the chat printed before the next prompt."""
    child.sendline(line)
    child.expect(r"\n> ")
    return child.before


def ask(child, line: str) -> tuple[str, str]:
    """Send a message; the answer as shown (colour codes included) and its stats line's text."""
    child.sendline(line)
    child.expect(STATS)
    answer, stats = child.before, SGR.sub("", child.match.group(0))
    child.expect(r"\n> ")
    return answer, stats


def ansi(style: str) -> str:
    """The escape sequence a 256-colour terminal gets for a style."""
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="256").print("x", style=style, end="")
    return out.getvalue().split("x")[0]


def plain_answer(tiny_gguf_dir, message: str) -> str:
    """The greedy answer to `message`, from `draftwise generate` with speculation off."""
    args = ["generate", "--chat", "--prompt", message, *model_args(tiny_gguf_dir), "--draft", "none"]
    result = CliRunner().invoke(main, [*args, "--max-tokens", "16", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])["text"]


def test_chat_session_through_a_terminal(tiny_gguf_dir, tmp_path):
    child = spawn(tiny_gguf_dir)
    answer, _ = ask(child, "hello")
    assert ansi(style_of("prediction")) not in answer

    assert "speculation off" in say(child, "/spec off")
    answer, stats = ask(child, "copy this: a b c a b c")
    assert "0 drafted" in stats and "speculation off" in stats and "ngram" not in stats
    assert ansi(style_of("ngram")) not in answer
    say(child, "/spec on")
    assert "conversation cleared" in say(child, "/reset")

    predicted = tmp_path / "answer.txt"
    predicted.write_text(plain_answer(tiny_gguf_dir, "hello"))
    assert "the next answer's prediction is" in say(child, f"/prediction {predicted}")
    answer, stats = ask(child, "hello")
    assert "acceptance" in stats and re.search(r"prediction \d+", stats)
    # Drafted tokens carry the prediction's colour; the target's own carry none.
    assert ansi(style_of("prediction")) in answer

    assert "cannot read" in say(child, f"/prediction {tmp_path / 'missing.txt'}")
    assert "system message: be brief" in say(child, "/system be brief")
    ask(child, "and now?")  # the chat goes on after the error

    assert "/spec on|off" in say(child, "/help")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_end_of_input_leaves_and_no_color_is_plain(tiny_gguf_dir):
    child = spawn(tiny_gguf_dir, "--no-color", colour=False)
    shown = say(child, "hello")  # the answer and its stats line
    assert re.search(STATS, shown) and not SGR.search(shown)
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_ctrl_c_stops_an_answer_and_the_chat_goes_on(tiny_gguf_dir):
    child = spawn(tiny_gguf_dir, "--draft", "none", max_tokens=480)
    child.sendline("hello")
    child.expect("hello\r\n")  # read: the answer is on its way
    child.sendintr()
    # The answer stops between steps; should it have ended first, the prompt is interrupted instead.
    child.expect([r"stopped[^\r\n]*\]", r"Ctrl-D to leave"])
    child.expect(r"\n> ")
    ask(child, "and again")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
