"""Tool-call formats, one module each; choose_format() picks the one a model speaks: the one its
chat template renders, else its family's (by the vocabulary's tokens, for a GGUF answered with a
built-in template), else plain JSON objects (plain.py), described to the model in the prompt.

A new format is a module with a ToolFormat subclass, added to FORMATS.
"""

from __future__ import annotations

from collections.abc import Callable

from draftwise.tools.formats.base import ToolFormat
from draftwise.tools.formats.hermes import HermesFormat
from draftwise.tools.formats.llama3 import Llama3JsonFormat
from draftwise.tools.formats.mistral import MistralFormat
from draftwise.tools.formats.plain import PlainJsonFormat

FORMATS: tuple[ToolFormat, ...] = (HermesFormat(), Llama3JsonFormat(), MistralFormat())
PLAIN = PlainJsonFormat()


def format_for(template: str | None) -> ToolFormat | None:
    """The format whose calls the chat template renders, or None (the template knows no tools)."""
    if not template:
        return None
    return next((f for f in FORMATS if f.matches(template)), None)


def renders_tools(template: str | None) -> bool:
    """Whether a chat template lays out the request's tools itself (else the plan describes
    them in a system message: ToolPlan.messages)."""
    return format_for(template) is not None


def choose_format(template: str | None, has_token: Callable[[str], bool]) -> ToolFormat:
    """The format of the template; else of the family whose marking tokens the vocabulary holds
    (has_token(text): whether text is one token); else PLAIN. Example: no template and a
    vocabulary with "[TOOL_CALLS]" -> MistralFormat."""
    named = format_for(template)
    if named is not None:
        return named
    return next((f for f in FORMATS if f.tokens and all(has_token(t) for t in f.tokens)), PLAIN)


def vocabulary_has(tokenizer) -> Callable[[str], bool]:
    """has_token for a tokenizer: whether a text encodes as one token that decodes as itself."""

    def has_token(text: str) -> bool:
        ids = tokenizer.encode(text, add_special=False, parse_special=True)
        return len(ids) == 1 and tokenizer.token_text(ids[0]) == text

    return has_token


__all__ = ["FORMATS", "PLAIN", "ToolFormat", "choose_format", "format_for", "renders_tools", "vocabulary_has"]
