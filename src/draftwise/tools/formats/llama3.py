"""Llama 3.1-3.3 tool calls (custom tools, JSON): the template lists the tools in the first user
message and the model answers one call as a JSON object, its arguments under "parameters":

    {"name": "get_weather", "parameters": {"city": "Paris"}}

optionally after <|python_tag|> (the token Llama 3.1 opens a tool call with; the trigger of the
lazy grammar). Without it, the object is found by its start (json_block.pattern, as llama.cpp's
Llama 3.x handler finds it), so under any tool_choice a call may come either way. The template
renders one call per assistant turn, so this format takes one.
"""

from __future__ import annotations

from draftwise.tools.formats.base import JsonCallsFormat


class Llama3JsonFormat(JsonCallsFormat):
    name = "llama3_json"
    trigger = "<|python_tag|>"
    tokens = ("<|python_tag|>", "<|start_header_id|>")
    json_blocks = True
    trigger_optional = True
    single = True
    arguments_key = "parameters"
    block_indents = (None, 2, 4)

    def matches(self, template: str) -> bool:
        # llama.cpp tells Llama 3.x templates by the ipython turn that answers a call
        return "<|start_header_id|>ipython<|end_header_id|>" in template or (
            "<|python_tag|>" in template and "tools" in template
        )
