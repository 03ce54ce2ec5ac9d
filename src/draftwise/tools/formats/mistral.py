"""Mistral tool calls (Mistral 7B v0.3, Nemo, Small, Codestral's instruct templates): the tools
in [AVAILABLE_TOOLS] before the last user message, and the calls as one JSON list after the
[TOOL_CALLS] token:

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]

(the trigger of the lazy grammar is [TOOL_CALLS]; several calls are the list's items).
"""

from __future__ import annotations

from draftwise.tools.formats.base import JsonCallsFormat


class MistralFormat(JsonCallsFormat):
    name = "mistral"
    trigger = "[TOOL_CALLS]"
    tokens = ("[TOOL_CALLS]",)
    joiner = ", "
    list_open = "["
    list_close = "]"

    def matches(self, template: str) -> bool:
        return "[TOOL_CALLS]" in template
