"""Calls as plain JSON objects, for a model whose chat template names no tool-call format (a
built-in template, or its own without tools): the tools are described in a system message
(ToolPlan.messages) and the model answers a call as

    {"name": "get_weather", "arguments": {"city": "Paris"}}

(bare or in a ```json block). There is no trigger token: under tool_choice auto the text is free
until an object naming a tool begins (json_block.pattern), and the grammar holds from there;
under required or a named tool, from the first token.
"""

from __future__ import annotations

from draftwise.tools.formats.base import JsonCallsFormat


class PlainJsonFormat(JsonCallsFormat):
    name = "json"
    trigger = ""
    json_blocks = True
    trigger_optional = True
    block_indents = (None, 2, 4)
    separator = "\n"  # between past calls written into the prompt (ToolPlan.messages)

    def matches(self, template: str) -> bool:
        return False  # chosen when no other format is (draftwise.tools.formats.choose_format)
