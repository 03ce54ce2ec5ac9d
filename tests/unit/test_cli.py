"""CLI contract: bad arguments give one clear line and exit status 2, never a traceback."""

import json

import pytest
from click.testing import CliRunner

from draftwise.cli import main


@pytest.fixture
def tiny(tiny_gguf_dir):
    return str(tiny_gguf_dir / "target.gguf")


def run(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--k", "0"], "max_draft_tokens"),
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "0"], "top_p"),
        (["--top-p", "1.5"], "top_p"),
        (["--max-tokens", "0"], "max_tokens"),
        (["--target", "/no/such/model.gguf"], "neither a known name"),
        (["--draft", "/no/such/draft.gguf"], "neither a known name"),
        (["--n-ctx", "64", "--prompt", "x " * 400], "context"),
    ],
)
def test_bad_arguments(tiny, args, message):
    base = ["generate", "--prompt", "hello", "--target", tiny, "--threads", "1"]
    result = run(*base, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_generate_json_on_tiny_model(tiny, tiny_gguf_dir):
    result = run(
        "generate",
        "--prompt",
        "def f(x):\n    return x\n\ndef f(x):\n",
        "--target",
        tiny,
        "--threads",
        "1",
        "--draft",
        f"ngram,{tiny_gguf_dir / 'twin.gguf'}",
        "--policy",
        "fixed",
        "--max-tokens",
        "20",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output.strip().splitlines()[-1])
    for key in (
        "text",
        "token_ids",
        "num_drafted",
        "num_accepted",
        "num_steps",
        "acceptance_rate",
        "mean_accepted_tokens",
        "tokens_per_step",
        "accepted_per_position",
        "tokens_per_second",
    ):
        assert key in data
    assert len(data["token_ids"]) <= 20 and data["num_drafted"] > 0


def test_generate_streams_and_prints_summary(tiny):
    result = run(
        "generate",
        "--prompt",
        "abc",
        "--target",
        tiny,
        "--threads",
        "1",
        "--draft",
        "none",
        "--max-tokens",
        "8",
        "--chat",
    )
    assert result.exit_code == 0, result.output
    assert "tokens/step" in result.output


def test_a_draft_of_another_vocabulary_drafts_across_it(tiny, tmp_path):
    """Same architecture, one token's text renamed: no longer the target's tokenizer, so the
    draft drafts across vocabularies (drafters/crossvocab.py), and the answer is plain decoding's.
    (A draft sharing too little of the target's vocabulary is refused: tests/unit/test_crossvocab.py.)"""
    import gguf  # noqa: F401

    from tiny_gguf import write_tiny_gguf

    other = write_tiny_gguf(tmp_path / "other.gguf")
    data = other.read_bytes().replace(b"</s>", b"<e>x", 1)  # same length, other text
    other.write_bytes(data)
    common = ("generate", "--prompt", "abc", "--target", tiny, "--threads", "1", "--max-tokens", "12", "--json")
    drafted = run(*common, "--draft", str(other), "--policy", "fixed")
    plain = run(*common, "--draft", "none")
    assert drafted.exit_code == 0 and plain.exit_code == 0, drafted.output + plain.output
    drafted, plain = (json.loads(r.output.strip().splitlines()[-1]) for r in (drafted, plain))
    assert drafted["text"] == plain["text"] and drafted["num_drafted"] > 0


def test_index_build_and_generate_with_datastore(tiny, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.py").write_text("def add(a, b):\n    return a + b\n" * 3)
    (corpus / "b.py").write_text("def sub(a, b):\n    return a - b\n")
    result = run("index", "build", str(corpus), "--out", str(tmp_path / "ds"), "--target", tiny, "--glob", "*.py")
    assert result.exit_code == 0, result.output
    assert "2 documents" in result.output
    result = run(
        "generate",
        "--prompt",
        "def add(a, b):\n",
        "--target",
        tiny,
        "--threads",
        "1",
        "--draft",
        "none",
        "--datastore",
        str(tmp_path / "ds"),
        "--policy",
        "fixed",
        "--max-tokens",
        "10",
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["drafter_choices"]


def test_missing_datastore_is_a_clear_error(tiny, tmp_path):
    result = run("generate", "--prompt", "x", "--target", tiny, "--datastore", str(tmp_path / "nope"))
    assert result.exit_code == 2 and "no datastore" in result.output
