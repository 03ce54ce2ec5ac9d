"""Fill-in-the-middle prompts, built from the model's own FIM tokens.

`fim_tokens(tokenizer)` finds the prefix/suffix/middle (and repo, file-separator, pad) tokens:
from the tokenizer itself where it knows them (llama.cpp's vocabulary API, which also finds them
by text when the GGUF has no `tokenizer.ggml.fim_*` metadata), and the roles it lacks as single
tokens spelling a known family's texts (Qwen, StarCoder2, DeepSeek-Coder, CodeLlama, Codestral).
`split_at` cuts a file at an editor's cursor. `fim_prompt` lays out llama.cpp's `/infill` prompt
(repo-level pattern, arXiv 2409.12186), e.g. for Qwen2.5-Coder with one extra file:

    <|repo_name|>myproject\\n<|file_sep|>util.py\\n{text}<|file_sep|>filename\\n
    <|fim_prefix|>{prefix}{prompt}<|fim_suffix|>{suffix}<|fim_middle|>
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from draftwise.backends.base import Tokenizer, utf8
from draftwise.errors import ConfigError

# Token texts by role, as llama.cpp's vocabulary loader looks for them (src/llama-vocab.cpp).
FIM_TEXTS: dict[str, tuple[str, ...]] = {
    "prefix": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
        "[PREFIX]",  # Codestral (Mistral's control tokens)
    ),
    "suffix": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
        "[SUFFIX]",
    ),
    "middle": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "repo": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<repo_name>"),
    "file_sep": ("<|file_sep|>", "<file_sep>"),  # Qwen, StarCoder2
}
# Prefix tokens of families trained without a middle token: Codestral reads
# [SUFFIX]{suffix}[PREFIX]{prefix} and writes the middle next (mistral-common's encode_fim).
MIDDLELESS_PREFIXES = ("[PREFIX]",)
# What llama.cpp's server writes where the model names no project or current file (kept, so a
# prompt here equals its prompt and the model sees the layout it was trained on).
REPO_NAME = "myproject"
CURRENT_FILE = "filename"
# Between extra chunks when the model has no file separator (llama.cpp's "\n\n--- snippet ---\n\n").
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"


class FimUnsupportedError(ConfigError):
    """The model has no fill-in-the-middle tokens."""


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int | None  # None: a middle-less family (Codestral): suffix first, nothing after the prefix
    pad: int | None = None
    repo: int | None = None
    file_sep: int | None = None


@dataclass(frozen=True)
class FimBudget:
    """llama.cpp's /infill cuts (format_prompt_infill, n_batch 512): the prefix keeps its last
    3/4 of a batch, the suffix its first 1/4 less the typed prompt, the extra context what the
    context leaves after a batch and twice the answer. None where nothing is cut."""

    batch: int = 512
    n_ctx: int | None = None
    n_predict: int = 0


@dataclass(frozen=True)
class FimPrompt:
    ids: list[int]
    num_prefix_dropped: int = 0  # tokens cut from the prefix's start (budget)
    num_suffix_dropped: int = 0  # tokens cut from the suffix's end
    num_extra_dropped: int = 0  # extra-context tokens cut from its start


def split_at(text: str, line: int, column: int) -> tuple[str, str]:
    """The text before and after a cursor at 1-based (line, column), column in characters, as
    editors count them; column len(line) + 1 is the line's end. Raises ConfigError out of range.

    Example: ("ab\\ncd\\n", 2, 2) -> ("ab\\nc", "d\\n")."""
    lines = text.split("\n")  # a text ending in a newline has an empty last line: the cursor may sit there
    if not 1 <= line <= len(lines):
        raise ConfigError(f"line must be in 1..{len(lines)}, got {line}")
    if not 1 <= column <= len(lines[line - 1]) + 1:
        raise ConfigError(f"column must be in 1..{len(lines[line - 1]) + 1} on line {line}, got {column}")
    at = sum(len(s) + 1 for s in lines[: line - 1]) + column - 1
    return text[:at], text[at:]


def fim_tokens(tokenizer: Tokenizer) -> FimTokens | None:
    """The model's FIM tokens, or None when it lacks prefix, suffix or middle (a middle-less
    family's prefix and suffix suffice: MIDDLELESS_PREFIXES).

    A tokenizer that knows its FIM tokens says so through `fim_token_ids()` ({role: id}, roles
    as in FIM_TEXTS); a role it does not name is the first of the role's texts that encodes to
    one token whose text it is (llama.cpp knows neither StarCoder2's "<file_sep>" nor Codestral's
    "[PREFIX]")."""
    ids: dict[str, int] = dict(tokenizer.fim_token_ids() or {})
    for role, texts in FIM_TEXTS.items():
        for text in texts if role not in ids else ():
            encoded = tokenizer.encode(text, add_special=False, parse_special=True)
            if len(encoded) == 1 and tokenizer.token_text(encoded[0]) == text:
                ids[role] = encoded[0]
                break
    if "prefix" not in ids or "suffix" not in ids:
        return None
    if "middle" not in ids and tokenizer.token_text(ids["prefix"]) not in MIDDLELESS_PREFIXES:
        return None
    return FimTokens(**{"middle": None, **ids})


def require_fim_tokens(tokenizer: Tokenizer) -> FimTokens:
    tokens = fim_tokens(tokenizer)
    if tokens is None:
        found = [role for role in ("prefix", "suffix", "middle") if _has_role(tokenizer, role)]
        lacks = [role for role in ("prefix", "suffix", "middle") if role not in found]
        raise FimUnsupportedError(
            f"this model has no fill-in-the-middle tokens (it lacks the {', '.join(lacks)} token"
            f"{'s' if len(lacks) > 1 else ''}: none of {', '.join(FIM_TEXTS[lacks[0]][:4])}, ...), so it "
            "cannot complete between a prefix and a suffix; use a FIM-trained model such as "
            "Qwen2.5-Coder, StarCoder2, DeepSeek-Coder, CodeLlama or Codestral"
        )
    return tokens


def _has_role(tokenizer: Tokenizer, role: str) -> bool:
    if role in (tokenizer.fim_token_ids() or {}):
        return True
    for text in FIM_TEXTS[role]:
        encoded = tokenizer.encode(text, add_special=False, parse_special=True)
        if len(encoded) == 1 and tokenizer.token_text(encoded[0]) == text:
            return True
    return False


def fim_prompt(
    tokenizer: Tokenizer,
    prefix: str,
    suffix: str,
    *,
    prompt: str = "",
    extra: Sequence[tuple[str, str]] = (),
    repo_level: bool = True,
    budget: FimBudget | None = None,
    tokens: FimTokens | None = None,
    spm: bool = False,
) -> FimPrompt:
    """The prompt ids for filling in between prefix (+ prompt, the typed part of the line) and
    suffix, after extra (filename, text) chunks. Prefix-suffix-middle order; every text is
    tokenised as text (a control token's text in code never becomes the control token).
    repo_level: the repo and current-file headers as llama.cpp's /infill writes them, where the
    model has those tokens (always with extra chunks); off, a single-file prompt.

    spm: suffix-prefix-middle order instead (llama.cpp's --spm-infill): <|fim_suffix|>{suffix}
    <|fim_prefix|>{prefix}{prompt}<|fim_middle|>, so the typed part of the line comes last and
    everything before it stays cached while a user types; whether the model completes as well
    that way depends on its training (measured for the default target in docs/code-completion.md).
    A middle-less family (Codestral) is always laid out so, with nothing after the prefix.

    Example (Qwen, repo_level=False): ("def f(", "):\\n") -> [<|fim_prefix|>, "def", " f", "(", <|fim_suffix|>,
    "):\\n", <|fim_middle|>].
    """
    tokens = tokens or require_fim_tokens(tokenizer)

    def text(s: str) -> list[int]:
        utf8(s)  # a lone surrogate is refused by name
        return tokenizer.encode(s, add_special=False, parse_special=False) if s else []

    ids_extra: list[int] = []
    if repo_level or extra:
        if tokens.repo is not None:
            ids_extra += [tokens.repo, *text(REPO_NAME + "\n")]
        for filename, chunk in extra:
            if tokens.file_sep is not None:
                ids_extra += [tokens.file_sep, *text((filename or "tmp") + "\n")]
            else:
                ids_extra += text(SNIPPET_SEPARATOR)
            ids_extra += text(chunk)
        if tokens.file_sep is not None:
            ids_extra += [tokens.file_sep, *text(CURRENT_FILE + "\n")]
    ids_prefix, ids_prompt, ids_suffix = text(prefix), text(prompt), text(suffix)
    dropped = [0, 0, 0]
    if budget is not None:
        n_prefix = min(len(ids_prefix), 3 * (budget.batch // 4))
        n_suffix = min(len(ids_suffix), max(0, budget.batch // 4 - (2 + len(ids_prompt))))
        n_extra = len(ids_extra)
        if budget.n_ctx is not None:
            n_extra = min(n_extra, max(0, budget.n_ctx - budget.batch - 2 * budget.n_predict))
        dropped = [len(ids_prefix) - n_prefix, len(ids_suffix) - n_suffix, len(ids_extra) - n_extra]
        ids_prefix = ids_prefix[len(ids_prefix) - n_prefix :]
        ids_suffix = ids_suffix[:n_suffix]
        ids_extra = ids_extra[len(ids_extra) - n_extra :]
    bos = tokenizer.encode("", add_special=True)  # [BOS] where the model adds one, else []
    before, after = [tokens.prefix, *ids_prefix, *ids_prompt], [tokens.suffix, *ids_suffix]
    spm = spm or tokens.middle is None
    middle = [tokens.middle] if tokens.middle is not None else []
    ids = [*bos, *ids_extra, *((after + before) if spm else (before + after)), *middle]
    return FimPrompt(ids, *dropped)
