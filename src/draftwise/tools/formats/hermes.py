"""Hermes / Qwen2.5 tool calls: the template lists the tools in the system prompt and the model
answers each call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(several calls one after another, a newline between them). Qwen2.5's "<tool_call>" and
"</tool_call>" are single tokens; the trigger of the lazy grammar is the first. Under auto,
calls written as ```json blocks are taken too (json_block.py): Qwen2.5-Coder writes them so.
"""

from __future__ import annotations

from draftwise.tools.formats.base import JsonCallsFormat


class HermesFormat(JsonCallsFormat):
    name = "hermes"
    trigger = "<tool_call>"
    tokens = ("<tool_call>", "</tool_call>")
    opener = "\n"
    closer = "\n</tool_call>"
    separator = "\n"
    json_blocks = True

    def matches(self, template: str) -> bool:
        return "<tool_call>" in template and "tools" in template
