"""A request's tools and tool_choice, checked as OpenAI defines them, and the messages of a tool
conversation as chat templates read them (assistant tool_calls with their arguments as JSON
objects, tool messages answering a call). Every refusal is a ToolSpecError naming its field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from draftwise.errors import ConfigError

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names
CHOICES = ("none", "auto", "required")


class ToolSpecError(ConfigError):
    """A malformed tools / tool_choice / tool message; param names the field (OpenAI's dotted path)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Tool:
    """One function the model may call. parameters: its JSON schema (an object schema)."""

    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False

    def as_openai(self) -> dict:
        """The tool as OpenAI's request carries it (what chat templates render)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """mode: "none" (text only), "auto" (text or calls), "required" (one call or more),
    "named" (exactly one call of `name`)."""

    mode: str = "auto"
    name: str | None = None


def parse_tools(raw: Sequence[Any]) -> tuple[Tool, ...]:
    """OpenAI's `tools` list -> Tools. Example: [{"type": "function", "function": {"name": "f"}}]
    -> (Tool("f"),)."""
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ToolSpecError("tools must be a non-empty list of function tools", "tools")
    tools, seen = [], set()
    for i, item in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(item, dict) or item.get("type", "function") != "function":
            raise ToolSpecError(
                f'{where} must be a function tool ({{"type": "function", "function": ...}})', f"{where}.type"
            )
        fn = item.get("function")
        if not isinstance(fn, dict):
            raise ToolSpecError(f"{where}.function must be an object", f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ToolSpecError(
                f"{where}.function.name must be 1-64 letters, digits, underscores or dashes, got {name!r}",
                f"{where}.function.name",
            )
        if name in seen:
            raise ToolSpecError(
                f"{where}.function.name {name!r} is given twice; tool names must be unique", f"{where}.function.name"
            )
        seen.add(name)
        parameters = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise ToolSpecError(
                f"{where}.function.parameters must be a JSON schema of type object", f"{where}.function.parameters"
            )
        description = fn.get("description") or ""
        if not isinstance(description, str):
            raise ToolSpecError(f"{where}.function.description must be a string", f"{where}.function.description")
        tools.append(Tool(name, description, parameters, bool(fn.get("strict") or False)))
    return tuple(tools)


def parse_tool_choice(raw: Any, tools: Sequence[Tool]) -> ToolChoice:
    """OpenAI's tool_choice ("none" | "auto" | "required" | {"type": "function", "function":
    {"name": ...}}; None: "auto") -> ToolChoice; a named function must be among the tools."""
    if raw is None:
        return ToolChoice("auto")
    if isinstance(raw, str):
        if raw not in CHOICES:
            raise ToolSpecError(
                f"tool_choice must be one of {', '.join(CHOICES)} or a named function, got {raw!r}", "tool_choice"
            )
        return ToolChoice(raw)
    name = raw.get("function", {}).get("name") if isinstance(raw, dict) and raw.get("type") == "function" else None
    if not isinstance(name, str):
        raise ToolSpecError('a named tool_choice is {"type": "function", "function": {"name": ...}}', "tool_choice")
    if name not in {t.name for t in tools}:
        raise ToolSpecError(f"tool_choice names {name!r}, which is not among the tools", "tool_choice.function.name")
    return ToolChoice("named", name)


def template_messages(messages: Sequence[dict]) -> list[dict]:
    """OpenAI messages -> what chat templates read: an assistant's tool_calls keep OpenAI's shape
    with `function.arguments` parsed into a JSON object (templates render it with tojson); every
    tool message must answer a call of the assistant message before it (by tool_call_id)."""
    out, open_calls = [], set()
    for i, message in enumerate(messages):
        message = dict(message)
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls, open_calls = [], set()
            for j, call in enumerate(message["tool_calls"]):
                where = f"messages[{i}].tool_calls[{j}]"
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise ToolSpecError(f"{where}.function.name is missing", f"{where}.function.name")
                arguments = fn.get("arguments", "{}")
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments or "{}")
                    except json.JSONDecodeError as exc:
                        raise ToolSpecError(
                            f"{where}.function.arguments is not JSON: {exc}", f"{where}.function.arguments"
                        ) from None
                calls.append(
                    {"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": arguments}}
                )
                if call.get("id"):
                    open_calls.add(call["id"])
            message["tool_calls"] = calls
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not call_id or call_id not in open_calls:
                raise ToolSpecError(
                    f"messages[{i}] (role tool) must answer a tool call of the assistant message "
                    f"before it; tool_call_id {call_id!r} matches none",
                    f"messages[{i}].tool_call_id",
                )
        elif role != "system":
            open_calls = set()
        out.append(message)
    return out
