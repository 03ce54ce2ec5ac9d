"""Fill-in-the-middle prompts (draftwise.fim) and /infill's pure pieces (sampling map, indentation
cut, response_fields), on the toy tokenizer and a tiny GGUF with Qwen2.5-Coder's FIM tokens."""

from __future__ import annotations

import pytest

from draftwise.backends.toy import CharTokenizer
from draftwise.errors import ConfigError
from draftwise.fim import FimBudget, FimUnsupportedError, fim_prompt, fim_tokens, require_fim_tokens, split_at
from draftwise.server.infill import InfillRequest, _pick, indent_cut, infill_sampling, logit_bias


@pytest.fixture(scope="module")
def fim_tokenizer(tmp_path_factory):
    from draftwise.backends.llamacpp import LlamaCppBackend
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path_factory.mktemp("fim") / "fim.gguf", fim=True)
    backend = LlamaCppBackend(path, n_ctx=512, n_threads=1)
    yield backend.tokenizer
    backend.close()


def texts(tokenizer, ids):
    return "".join(tokenizer.token_text(i) if i >= 256 else tokenizer.decode([i]) for i in ids)


def test_a_model_without_fim_tokens_is_refused():
    tokenizer = CharTokenizer(40)
    assert fim_tokens(tokenizer) is None
    with pytest.raises(FimUnsupportedError, match="fill-in-the-middle"):
        fim_prompt(tokenizer, "a", "b")


def test_tokens_come_from_llamacpp_vocabulary_without_metadata(fim_tokenizer):
    tokens = require_fim_tokens(fim_tokenizer)
    assert (tokens.prefix, tokens.suffix, tokens.middle, tokens.pad, tokens.repo, tokens.file_sep) == tuple(
        range(258, 264)
    )


def test_tokens_found_by_text_when_the_tokenizer_does_not_say(fim_tokenizer):
    class TextOnly:  # the same vocabulary, not knowing its FIM tokens (as a transformers tokenizer)
        encode, token_text = fim_tokenizer.encode, fim_tokenizer.token_text

        def fim_token_ids(self):
            return None

    assert fim_tokens(TextOnly()) == fim_tokens(fim_tokenizer)


def test_single_file_prompt_is_prefix_suffix_middle(fim_tokenizer):
    ids = fim_prompt(fim_tokenizer, "def f(", "):\n", repo_level=False).ids
    assert texts(fim_tokenizer, ids) == "<|fim_prefix|>def f(<|fim_suffix|>):\n<|fim_middle|>"


def test_repo_level_prompt_is_llamacpp_layout(fim_tokenizer):
    ids = fim_prompt(fim_tokenizer, "x = ", "\n", prompt="y", extra=[("a.py", "y = 1\n"), ("", "z")]).ids
    assert texts(fim_tokenizer, ids) == (
        "<|repo_name|>myproject\n<|file_sep|>a.py\ny = 1\n<|file_sep|>tmp\nz"
        "<|file_sep|>filename\n<|fim_prefix|>x = y<|fim_suffix|>\n<|fim_middle|>"
    )


def test_spm_puts_the_suffix_first_and_the_typed_line_last(fim_tokenizer):
    """llama.cpp's --spm-infill order (`draftwise measure fim-layouts` measures it for a model)."""
    ids = fim_prompt(fim_tokenizer, "x = ", "\n", prompt="y", extra=[("a.py", "y = 1\n")], spm=True).ids
    assert texts(fim_tokenizer, ids) == (
        "<|repo_name|>myproject\n<|file_sep|>a.py\ny = 1\n<|file_sep|>filename\n"
        "<|fim_suffix|>\n<|fim_prefix|>x = y<|fim_middle|>"
    )


def test_code_holding_control_token_text_stays_text(fim_tokenizer):
    ids = fim_prompt(fim_tokenizer, "s = '<|fim_middle|>'", "", repo_level=False).ids
    assert ids.count(260) == 1 and ids[-1] == 260


def test_budget_cuts_as_llamacpp(fim_tokenizer):
    """batch 16: prefix keeps its last 12 tokens, suffix its first 4 - 2 - len(prompt)."""
    built = fim_prompt(fim_tokenizer, "a" * 20, "b" * 20, prompt="c", repo_level=False, budget=FimBudget(batch=16))
    assert texts(fim_tokenizer, built.ids) == "<|fim_prefix|>" + "a" * 12 + "c<|fim_suffix|>b<|fim_middle|>"
    assert (built.num_prefix_dropped, built.num_suffix_dropped) == (8, 19)
    extra = fim_prompt(fim_tokenizer, "", "", extra=[("f", "0123456789")], budget=FimBudget(n_ctx=530, n_predict=5))
    # repo, separators and texts: 34 tokens; the context leaves 530 - 512 - 2 * 5 = 8, the last ones
    assert extra.num_extra_dropped == 1 + len("myproject\n") + 1 + len("f\n") + 10 + 1 + len("filename\n") - 8


@pytest.mark.parametrize(
    "text, n_indent, cut",
    [
        ("x\n    y\n  z", 4, len("x\n    y\n  ")),
        ("x\n    y\n    z", 4, None),
        ("  first line is never checked", 4, None),
        ("x\n\tq", 2, len("x\n\t")),
        ("x\n    ", 8, None),  # the line has not begun
        ("x\n\ny", 1, len("x\n")),  # an empty line ends it, as in llama.cpp
        ("x\ny", 0, None),
    ],
)
def test_indent_cut(text, n_indent, cut):
    assert indent_cut(text, n_indent) == cut


def body(**fields):
    return InfillRequest(input_prefix="", input_suffix="", **fields)


def test_sampling_follows_llamacpp_chain():
    vim = infill_sampling(body(top_k=40, top_p=0.99, samplers=["top_k", "top_p", "infill"]), 8)
    assert (vim.temperature, vim.top_k, vim.top_p, vim.min_p) == (1.0, 40, 0.99, 0.0)  # no temperature sampler
    default = infill_sampling(body(), 8)
    assert (default.temperature, default.top_k, default.top_p, default.min_p) == (0.8, 40, 0.95, 0.05)
    assert infill_sampling(body(temperature=0.0, samplers=["temperature"]), 8).greedy


def test_penalties_apply_where_the_chain_names_them_and_logit_bias_always():
    fields = {"repeat_penalty": 1.3, "repeat_last_n": 32, "presence_penalty": 0.5, "frequency_penalty": 0.25}
    tokenizer = CharTokenizer(vocab_size=50)
    on = infill_sampling(body(**fields, logit_bias=[[3, -2.0]]), 8, tokenizer, 50)  # the default chain: "penalties"
    assert (on.repeat_penalty, on.repeat_last_n, on.presence_penalty, on.frequency_penalty) == (1.3, 32, 0.5, 0.25)
    assert on.logit_bias == ((3, -2.0),)
    off = infill_sampling(body(**fields, logit_bias={"3": False}, samplers=["top_k", "temperature"]), 8, tokenizer, 50)
    assert (off.repeat_penalty, off.presence_penalty, off.frequency_penalty) == (1.0, 0.0, 0.0)
    assert off.logit_bias == ((3, -100.0),)  # false bans the token, whatever the chain


def test_logit_bias_takes_llamacpp_forms():
    tokenizer = CharTokenizer(vocab_size=50)
    assert logit_bias([[7, 1.5], ["12", -1]], tokenizer, 50) == ((7, 1.5), (12, -1.0))
    assert logit_bias({"7": False}, tokenizer, 50) == ((7, -100.0),)
    text_ids = tokenizer.encode("ab", add_special=False)
    assert logit_bias([["ab", 2.0]], tokenizer, 50) == tuple((t, 2.0) for t in sorted(set(text_ids)))
    for bad in ([[60, 1.0]], [[7, True]], [[7]], [[None, 1.0]], ["x"]):
        with pytest.raises(ConfigError, match="logit_bias"):
            logit_bias(bad, tokenizer, 50)


@pytest.mark.parametrize(
    "fields, bad",
    [
        ({"dry_multiplier": 0.8}, "dry_multiplier"),
        ({"samplers": ["mirostat_v9"]}, "samplers"),
        ({"grammar": 'root ::= "a"'}, "grammar"),
        ({"n_probs": 3}, "n_probs"),
        ({"samplers": ["dry", "penalties", "infill"], "id_slot": 2, "n_keep": 4}, None),
    ],
)
def test_unsupported_fields(fields, bad):
    assert body(**fields).unsupported() == bad


def test_response_fields_pick_nested_values():
    assert _pick({"a": {"b": 1}, "c": 2}, ["a/b", "c", "d", "a/x"]) == {"a/b": 1, "c": 2}


@pytest.mark.parametrize(
    "line, column, before",
    [(1, 1, ""), (1, 3, "ab"), (2, 2, "ab\nc"), (2, 3, "ab\ncd"), (3, 1, "ab\ncd\n")],
)
def test_split_at_cursor(line, column, before):
    assert split_at("ab\ncd\n", line, column) == (before, "ab\ncd\n"[len(before) :])


@pytest.mark.parametrize("line, column", [(0, 1), (4, 1), (1, 0), (1, 4), (3, 2)])
def test_split_at_refuses_a_cursor_outside_the_text(line, column):
    with pytest.raises(ConfigError, match="line" if line in (0, 4) else "column"):
        split_at("ab\ncd\n", line, column)
