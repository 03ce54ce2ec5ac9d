"""Tool-call formats, one module each; format_for() picks the one a chat template speaks.

A new format (Llama 3.x JSON calls, Mistral's [TOOL_CALLS]) is a module with a ToolFormat
subclass, added to FORMATS.
"""

from __future__ import annotations

from draftwise.tools.formats.base import ToolFormat
from draftwise.tools.formats.hermes import HermesFormat

FORMATS: tuple[ToolFormat, ...] = (HermesFormat(),)


def format_for(template: str | None) -> ToolFormat | None:
    """The format whose calls the chat template renders, or None (the template knows no tools)."""
    if not template:
        return None
    return next((f for f in FORMATS if f.matches(template)), None)


__all__ = ["FORMATS", "ToolFormat", "format_for"]
