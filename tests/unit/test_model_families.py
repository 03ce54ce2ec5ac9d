"""Any GGUF family answers chat or says what it lacks: llama.cpp's built-in templates by name
and by family (draftwise.backends.chat_templates), end-of-turn tokens from the vocabulary, and
the FIM tokens of the code families (draftwise.fim) on tiny GGUF models of those vocabularies."""

from __future__ import annotations

import pytest

from draftwise.backends.chat_templates import builtin_names, family_template, named_template, render_builtin
from draftwise.errors import ConfigError
from draftwise.fim import FimUnsupportedError, fim_prompt, fim_tokens, require_fim_tokens
from tiny_gguf import write_tiny_gguf

HI = [{"role": "user", "content": "hi"}]


def _backend(path, **kwargs):
    from draftwise.backends.llamacpp import LlamaCppBackend

    return LlamaCppBackend(path, n_ctx=256, n_threads=1, **kwargs)


def test_builtin_templates_are_llamacpps():
    names = builtin_names()
    assert {"chatml", "llama2", "llama3", "mistral-v7", "gemma", "phi3", "zephyr", "deepseek", "deepseek3"} <= set(
        names
    )
    assert render_builtin("gemma", HI, add_generation_prompt=True) == (
        "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    )
    assert render_builtin("chatml", HI, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"
    parts = [{"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}]
    assert render_builtin("chatml", parts, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"
    long = [{"role": "user", "content": "x" * 5000}]  # more than the first buffer holds
    assert render_builtin("llama3", long, add_generation_prompt=True).count("x") == 5000


def test_a_bad_template_name_lists_the_builtin_ones():
    with pytest.raises(ConfigError, match="neither a Jinja file.*chatml.*gemma"):
        named_template("gemma-9")


@pytest.mark.parametrize(
    "architecture, tokens, expected",
    [
        ("gemma3", set(), "gemma"),
        ("llama", {"<start_of_turn>", "<end_of_turn>"}, "gemma"),
        ("llama", {"<|start_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"}, "llama3"),
        ("llama", {"<|im_start|>", "<|im_end|>"}, "chatml"),
        ("qwen3", set(), "chatml"),
        ("llama", {"[SYSTEM_PROMPT]", "[INST]", "[/INST]"}, "mistral-v7"),
        ("phi3", set(), "phi3"),
        ("llama", set(), None),  # a Llama-architecture model may be any family
        ("starcoder2", set(), None),
    ],
)
def test_family_template(architecture, tokens, expected):
    assert family_template(architecture, tokens.__contains__) == expected


def test_a_gemma_vocabulary_answers_with_gemmas_template_and_ends_its_turn(tmp_path):
    path = write_tiny_gguf(tmp_path / "g.gguf", special_tokens=("<start_of_turn>", "<end_of_turn>"))
    backend = _backend(path)
    try:
        tokenizer = backend.tokenizer
        assert tokenizer.apply_chat_template(HI) == "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
        assert tokenizer.chat_template is None  # a built-in template knows no tools
        end_of_turn = tokenizer.encode("<end_of_turn>", add_special=False)
        assert len(end_of_turn) == 1 and end_of_turn[0] in tokenizer.eos_token_ids
    finally:
        backend.close()


def test_a_named_template_replaces_the_ggufs_own(tmp_path):
    path = write_tiny_gguf(tmp_path / "t.gguf", chat_template="{{ messages[0]['content'] }}")
    backend = _backend(path, chat_template="zephyr")
    try:
        assert backend.tokenizer.apply_chat_template(HI) == "<|user|>\nhi<|endoftext|>\n<|assistant|>\n"
    finally:
        backend.close()


# ---------------------------------------------------------------------- FIM
STARCODER2 = ("<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<repo_name>", "<file_sep>")
CODESTRAL = ("[INST]", "[/INST]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]")


def _texts(tokenizer, ids):
    return "".join(tokenizer.token_text(i) if i >= 256 else tokenizer.decode([i]) for i in ids)


def test_starcoder2s_file_separator_and_repo_are_found_by_text(tmp_path):
    backend = _backend(write_tiny_gguf(tmp_path / "s.gguf", special_tokens=STARCODER2))
    try:
        tokenizer = backend.tokenizer
        tokens = require_fim_tokens(tokenizer)
        assert [tokenizer.token_text(t) for t in (tokens.prefix, tokens.suffix, tokens.middle)] == [
            "<fim_prefix>",
            "<fim_suffix>",
            "<fim_middle>",
        ]
        assert (tokenizer.token_text(tokens.repo), tokenizer.token_text(tokens.file_sep)) == (
            "<repo_name>",
            "<file_sep>",
        )
    finally:
        backend.close()


def test_codestral_reads_the_suffix_first_and_has_no_middle_token(tmp_path):
    backend = _backend(write_tiny_gguf(tmp_path / "c.gguf", special_tokens=CODESTRAL))
    try:
        tokenizer = backend.tokenizer
        tokens = fim_tokens(tokenizer)
        assert tokens is not None and tokens.middle is None
        ids = fim_prompt(tokenizer, "def f(", "):\n", repo_level=False).ids
        assert _texts(tokenizer, ids) == "[SUFFIX]):\n[PREFIX]def f("
    finally:
        backend.close()


def test_a_model_without_fim_tokens_says_which_it_lacks(tmp_path):
    backend = _backend(write_tiny_gguf(tmp_path / "n.gguf", special_tokens=("<fim_prefix>",)))
    try:
        with pytest.raises(FimUnsupportedError, match="lacks the suffix, middle tokens"):
            require_fim_tokens(backend.tokenizer)
    finally:
        backend.close()
