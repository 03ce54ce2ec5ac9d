"""OpenAI tool calling: the request's tools and tool_choice (spec), the per-model call formats
(formats/: the prompt side, the grammar of a call, the parser of an answer), and tool_plan(),
which turns a request into the Constraint the engine decodes under.

Example: plan = tool_plan(tokenizer, tools, ToolChoice("auto")); plan.constraint is lazy: free
text until "<tool_call>" (Qwen2.5), then calls whose names and arguments follow the tools.
"""

from draftwise.tools.formats import ToolFormat, format_for
from draftwise.tools.formats.base import Parsed, StreamEvent, ToolCall
from draftwise.tools.plan import ToolPlan, tool_plan
from draftwise.tools.spec import Tool, ToolChoice, parse_tool_choice, parse_tools, template_messages

__all__ = [
    "Parsed",
    "StreamEvent",
    "Tool",
    "ToolCall",
    "ToolChoice",
    "ToolFormat",
    "ToolPlan",
    "format_for",
    "parse_tool_choice",
    "parse_tools",
    "template_messages",
    "tool_plan",
]
