"""draftwise complete: the middle at a cursor equals the engine's answer to the prompt /infill
builds there (greedy, with and without speculation), --json carries timings and metrics, and bad
input (a cursor outside the file, a model without FIM tokens) is one line and exit status 2.

The FIM model is a tiny random GGUF holding Qwen2.5-Coder's FIM tokens: its middles are noise,
but deterministic."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from draftwise.backends.llamacpp import LlamaCppBackend
from draftwise.cli import main
from draftwise.engine import Engine
from draftwise.fim import FimBudget, fim_prompt
from draftwise.types import SamplingParams, SpeculationConfig

SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    \n"


@pytest.fixture(scope="module")
def fim_gguf(tmp_path_factory):
    from tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("fim") / "fim.gguf", fim=True)


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "ops.py"
    path.write_text(SOURCE)
    return path


def complete(*args):
    return CliRunner().invoke(main, ["complete", *map(str, args)])


def expected_middle(fim_gguf, prefix, suffix, extra=(), max_tokens=24) -> str:
    target = LlamaCppBackend(fim_gguf, n_ctx=2048, n_threads=1)
    try:
        engine = Engine(target, [], speculation=SpeculationConfig(enabled=False))
        ids = fim_prompt(
            engine.tokenizer, prefix, suffix, extra=extra, budget=FimBudget(n_ctx=2048, n_predict=max_tokens)
        ).ids
        return engine.generate(prompt_ids=ids, sampling=SamplingParams(max_tokens=max_tokens)).text
    finally:
        target.close()


@pytest.mark.parametrize("draft", ["none", "ngram"])
def test_middle_is_the_engines_answer_at_the_cursor(fim_gguf, source, tmp_path, draft):
    extra = tmp_path / "util.py"
    extra.write_text("def mul(a, b):\n    return a * b\n")
    out = complete(
        source,
        "--line",
        6,
        "--column",
        5,
        "--extra",
        extra,
        "--target",
        fim_gguf,
        "--threads",
        1,
        "--n-ctx",
        2048,
        "--draft",
        draft,
        "--policy",
        "fixed",
        "--max-tokens",
        24,
    )
    assert out.exit_code == 0, out.output
    prefix, suffix = SOURCE[: SOURCE.rindex("\n", 0, -1) + 5], "\n"
    assert out.stdout == expected_middle(fim_gguf, prefix, suffix, extra=[("util.py", extra.read_text())])


def test_json_has_middle_timings_and_metrics(fim_gguf, source):
    out = complete(
        source, "--line", 2, "--column", 5, "--target", fim_gguf, "--threads", 1, "--n-ctx", 2048, "--policy", "fixed"
    )
    plain = out.stdout
    out = complete(
        source,
        "--line",
        2,
        "--column",
        5,
        "--target",
        fim_gguf,
        "--threads",
        1,
        "--n-ctx",
        2048,
        "--policy",
        "fixed",
        "--json",
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["text"] == plain
    timings = data["timings"]
    assert timings["prompt_n"] == data["num_prompt_tokens"] > len("    return a + b")
    # As /infill's (and llama.cpp's n_decoded): every sampled token, the EOS that ended the middle too.
    assert timings["predicted_n"] == data["num_generated"] + data["num_eos"] >= 1 and timings["predicted_ms"] > 0
    assert data["num_prefix_dropped"] == data["num_suffix_dropped"] == data["num_extra_dropped"] == 0
    assert "num_drafted" in data and "finish_reason" in data


@pytest.mark.parametrize(
    "line, column, message",
    [
        (0, 1, "line must be in 1..7, got 0"),
        (8, 1, "line must be in 1..7, got 8"),
        (1, 0, "column must be in 1..15 on line 1, got 0"),
        (2, 18, "column must be in 1..17 on line 2, got 18"),
    ],
)
def test_cursor_outside_the_file(fim_gguf, source, line, column, message):
    out = complete(source, "--line", line, "--column", column, "--target", fim_gguf, "--threads", 1)
    assert out.exit_code == 2 and out.output.strip() == f"error: {message}"


def test_model_without_fim_tokens(tiny_gguf_dir, source):
    target = tiny_gguf_dir / "target.gguf"
    out = complete(source, "--line", 2, "--column", 5, "--target", target, "--threads", 1, "--policy", "fixed")
    assert out.exit_code == 2 and "no fill-in-the-middle tokens" in out.output
    assert "Traceback" not in out.output


def test_file_that_is_not_text(fim_gguf, tmp_path):
    binary = tmp_path / "blob.py"
    binary.write_bytes(b"x = 1\n\xff\xfe\n")
    out = complete(binary, "--line", 1, "--column", 1, "--target", fim_gguf, "--threads", 1)
    assert out.exit_code == 2 and "is not UTF-8 text" in out.output
