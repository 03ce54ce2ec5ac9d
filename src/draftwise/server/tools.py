"""Tool calling on /v1/chat/completions: the request's tools and tool_choice -> the plan the
engine decodes under (draftwise.tools), and the answer -> OpenAI's message.tool_calls and
streamed delta.tool_calls (id and name first, then fragments of the arguments)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from draftwise.constraints import schema_fault
from draftwise.server.errors import APIError
from draftwise.tools import (
    Parsed,
    StreamEvent,
    Tool,
    ToolPlan,
    parse_tool_choice,
    parse_tools,
    template_messages,
    tool_plan,
)
from draftwise.tools.formats.base import JsonCallsParser
from draftwise.tools.spec import ToolSpecError


@dataclass
class ChatTools:
    """A chat request's tools: the plan, the tools as templates render them, a parser per choice."""

    plan: ToolPlan
    rendered: list[dict]
    parsers: dict[int, JsonCallsParser] = field(default_factory=dict)

    def parse(self, text: str) -> Parsed:
        return self.plan.parse(text)

    def feed(self, index: int, text: str) -> list[StreamEvent]:
        return self._parser(index).feed(text)

    def finish(self, index: int) -> tuple[list[StreamEvent], bool]:
        """The held-back deltas of choice `index`, and whether it made calls."""
        parser = self._parser(index)
        return parser.finish(), bool(parser.calls)

    def _parser(self, index: int) -> JsonCallsParser:
        if index not in self.parsers:
            self.parsers[index] = self.plan.parser()
        return self.parsers[index]


def chat_tools(body, tokenizer, messages: list[dict]) -> tuple[ChatTools | None, list[dict]]:
    """Validate tools, tool_choice and the tool messages (400 naming the field); the plan (None
    without tools) and the messages as chat templates read them (the tools described in them
    where the template lays out none: ToolPlan.messages)."""
    try:
        messages = template_messages(messages)
        if not body.tools:
            if body.tool_choice not in (None, "none", "auto"):
                raise ToolSpecError("tool_choice needs tools", "tool_choice")
            return None, messages
        if body.response_format is not None and body.response_format.type != "text":
            raise ToolSpecError("give tools or response_format, not both", "response_format")
        tools = enforceable(parse_tools(body.tools))
        choice = parse_tool_choice(body.tool_choice, tools)
        parallel = True if body.parallel_tool_calls is None else body.parallel_tool_calls
        plan = tool_plan(tokenizer, tools, choice, parallel)
    except ToolSpecError as exc:
        raise APIError(400, str(exc), param=exc.param, code="invalid_value") from None
    return ChatTools(plan, [t.as_openai() for t in tools]), plan.messages(messages)


def enforceable(tools: Sequence[Tool]) -> Sequence[Tool]:
    """tools, once each one's parameters are a schema the grammar enforces exactly (the calls'
    arguments always follow it); else a ToolSpecError naming the first that is not."""
    for i, tool in enumerate(tools):
        fault = schema_fault(tool.parameters)
        if fault is not None:
            where = f"tools[{i}].function.parameters"
            raise ToolSpecError(f"{where}: invalid json schema: {fault}", where)
    return tools


def message_fields(message) -> dict[str, Any]:
    """The tool fields of a chat message (assistant tool_calls, a tool message's tool_call_id)."""
    out: dict[str, Any] = {}
    if message.tool_calls:
        out["tool_calls"] = [dict(c) for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def answer(tools: ChatTools, text: str, finish: str | None) -> tuple[dict[str, Any], str | None]:
    """(message fields, finish_reason) of a whole answer: content (None when only calls) and
    tool_calls; finish_reason "tool_calls" when the answer ended with calls."""
    parsed = tools.parse(text)
    if not parsed.calls:
        return {"content": text}, finish
    calls = [c.as_openai() for c in parsed.calls]
    return {"content": parsed.content, "tool_calls": calls}, "tool_calls" if finish == "stop" else finish


def deltas(events: list[StreamEvent], chunk: Callable[[dict], str]) -> str:
    """SSE chunks for parser events: content deltas, and delta.tool_calls as OpenAI streams them."""
    out = []
    for e in events:
        if e.content:
            out.append(chunk({"content": e.content}))
        elif e.name is not None:
            out.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": e.index,
                                "id": e.id,
                                "type": "function",
                                "function": {"name": e.name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
        elif e.arguments:
            out.append(chunk({"tool_calls": [{"index": e.index, "function": {"arguments": e.arguments}}]}))
    return "".join(out)
