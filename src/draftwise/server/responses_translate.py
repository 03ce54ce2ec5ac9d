"""OpenAI's Responses requests -> the /v1/chat/completions request they mean, beside translate.py's
translators: `input` (text or items: messages, function_call, function_call_output) and
`instructions` as chat messages, flat function tools as chat tools, `text.format` as
response_format, max_output_tokens as max_completion_tokens. The chat request then takes the
chat route's own path to the engine (translate.chat), so a greedy answer here equals
/v1/chat/completions' token for token, constraints and tool calls included; `translate` does it
all once per request, with the ResponsesReply the answer reads.

Every refusal is an APIError (400 naming the field): built-in tools, reasoning effort, background
mode, images and files, and the other fields the engine cannot serve.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from draftwise.engine import Engine
from draftwise.server import protocol as p
from draftwise.server import translate as chat_translate
from draftwise.server.errors import APIError
from draftwise.server.prepared import Prepared
from draftwise.server.responses_protocol import ResponsesRequest, Stored, namespaces, qualified

# Content part types read as text, by the role whose message carries them.
_TEXT_PARTS = ("input_text", "output_text", "text")


@dataclasses.dataclass(frozen=True)
class ResponsesReply(chat_translate.OpenAIReply):
    """How a /v1/responses request is answered: as the one chat choice it means, with the settings
    the response object repeats (at OpenAI's defaults where the request has none), whether it is
    stored, and the conversation it continues (what the store keeps with it: the turns before
    this answer)."""

    store: bool = True
    previous_response_id: str | None = None
    conversation: tuple[dict[str, Any], ...] = ()
    namespaces: frozenset[str] = frozenset()  # namespace tools: their calls name them apart
    instructions: str | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool = True
    temperature: float = 1.0
    text_format: dict[str, Any] = dataclasses.field(default_factory=lambda: {"type": "text"})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    top_p: float = 1.0
    truncation: str = "disabled"
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)
    user: str | None = None


def translate(
    engine: Engine,
    body: ResponsesRequest,
    previous: Stored | None,
    served: tuple[str, Sequence[str]],
    capacity: int,
) -> Prepared[ResponsesReply]:
    """A /v1/responses request (refuse_unsupported passed; previous: the stored response it
    continues), translated once: the chat request it means, through translate.chat (the engine's
    request and tools), and its reply. It tokenises: routes run it in a worker thread."""
    conversation = [*(previous.conversation if previous else ()), *input_messages(body.input)]
    chat = chat_request(body, conversation)
    with in_responses_terms():
        prepared = chat_translate.chat(engine, chat, served, capacity, prompt_param="input")
    reply = responses_reply(body, tools=prepared.tools is not None, conversation=tuple(conversation))
    return Prepared(prepared.requests, reply, prepared.tools)


def responses_reply(
    body: ResponsesRequest, *, tools: bool = False, conversation: tuple[dict[str, Any], ...] = ()
) -> ResponsesReply:
    """The reply of a request; tools: it decodes under tools (else its constraint is text.format)."""
    fmt = body.text.format.model_dump(by_alias=True, exclude_none=True) if body.text and body.text.format else None
    return ResponsesReply(
        stream=bool(body.stream),
        constraint_param="tools" if tools else "text.format",
        prompt_param="input",
        store=body.store is not False,
        previous_response_id=body.previous_response_id,
        conversation=conversation,
        namespaces=namespaces(body.tools),
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        parallel_tool_calls=True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        temperature=1.0 if body.temperature is None else body.temperature,
        text_format=fmt or {"type": "text"},
        tool_choice=body.tool_choice or "auto",
        tools=body.tools or [],
        top_p=1.0 if body.top_p is None else body.top_p,
        truncation=body.truncation or "disabled",
        metadata=body.metadata or {},
        user=body.user,
    )


def _refuse(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="unsupported_parameter")


def refuse_unsupported(body: ResponsesRequest) -> None:
    """Fields set to what this server cannot serve: a 400 naming the first."""
    if body.background:
        raise _refuse("background", "background mode is not supported by this server; send background: false")
    if body.reasoning is not None and body.reasoning.effort not in (None, "none"):
        raise _refuse(
            "reasoning.effort",
            f"reasoning.effort {body.reasoning.effort!r} is not supported with this model: it does not reason",
        )
    if body.conversation is not None:
        raise _refuse("conversation", "conversations are not supported by this server; use previous_response_id")
    if body.prompt is not None:
        raise _refuse("prompt", "prompt templates are not supported by this server; send input and instructions")
    if body.top_logprobs:
        raise _refuse("top_logprobs", "top_logprobs is not supported on /v1/responses; use /v1/chat/completions")
    if body.max_tool_calls is not None:
        raise _refuse("max_tool_calls", "max_tool_calls is not supported by this server")
    if body.text is not None and body.text.verbosity not in (None, "medium"):
        raise _refuse("text.verbosity", "text.verbosity is not supported by this server; leave it out")
    for i, tool in enumerate(body.tools or ()):
        kind = tool.get("type")
        if kind == "namespace":
            inner = tool.get("tools") or []
            bad = next((j for j, t in enumerate(inner) if not isinstance(t, dict) or t.get("type") != "function"), None)
            if bad is None and isinstance(tool.get("name"), str):
                continue
            raise _refuse(
                f"tools[{i}].tools[{bad}].type" if bad is not None else f"tools[{i}].name",
                f"tools[{i}] is a namespace: it needs a name, and only function tools inside it are supported",
            )
        if kind != "function":
            raise _refuse(
                f"tools[{i}].type",
                f"tools[{i}] is of type {kind!r}: only function tools are supported by this server "
                "(built-in tools such as web_search, file_search, code_interpreter and custom tools are not)",
            )


def function_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Flat Responses function tools -> chat's {"type": "function", "function": {...}}; a namespace's
    functions (Codex groups its sub-agent tools so) become "{namespace}__{name}".
    Example: {"type": "function", "name": "f", "parameters": {...}, "strict": true} ->
    {"type": "function", "function": {"name": "f", "parameters": {...}, "strict": true}}."""
    if not tools:
        return None
    keys = ("name", "description", "parameters", "strict")
    out = []
    for tool in tools:
        namespace = tool["name"] if tool.get("type") == "namespace" else None
        for t in tool.get("tools") or [] if namespace else [tool]:
            function = {k: t[k] for k in keys if t.get(k) is not None}
            function["name"] = qualified(t.get("name", ""), namespace)
            if namespace and tool.get("description"):
                function["description"] = f"{tool['description']} {t.get('description', '')}".strip()
            out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """{"type": "function", "name": "f"} -> chat's {"type": "function", "function": {"name": "f"}}."""
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise _refuse("tool_choice", f"tool_choice of type {choice.get('type')!r} is not supported by this server")
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _text(content: Any, where: str) -> str:
    """A message's content (a string or text parts) as its text; images and files are a 400."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{where}.content must be a string or a list of parts", param=f"{where}.content")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_image", "input_file", "input_audio"):
            raise _refuse(
                f"{where}.content[{j}]", f"{kind} is not supported by this server: draftwise serves text-only models"
            )
        if kind == "refusal":
            out.append(part.get("refusal") or "")
            continue
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise APIError(400, f"{where}.content[{j}] must be a text part", param=f"{where}.content[{j}]")
        out.append(part["text"])
    return "".join(out)


def input_messages(raw: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`input` -> chat messages. A function_call joins the assistant message just before it (so
    an answer's text and its calls are one assistant turn, as chat templates lay them out); a
    function_call_output is a tool message; reasoning items (which this server never makes) are
    dropped. Example: [message user "hi", function_call f, function_call_output] -> [user,
    assistant with tool_calls [f], tool]."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"{where}.role must be user, system, developer or assistant", param=f"{where}.role")
            out.append(
                {"role": "system" if role == "developer" else role, "content": _text(item.get("content"), where)}
            )
        elif kind == "function_call":
            arguments = item.get("arguments")
            if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
                raise APIError(400, f"{where} needs call_id and name", param=where)
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {
                    "name": qualified(item["name"], item.get("namespace")),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
                },
            }
            if not out or out[-1]["role"] != "assistant":
                out.append({"role": "assistant", "content": None})
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, where)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue
        elif kind == "item_reference":
            raise _refuse(f"{where}.type", "item references are not supported by this server; send the items")
        else:
            raise _refuse(f"{where}.type", f"input items of type {kind!r} are not supported by this server")
    return out


def output_messages(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A response's output items as the chat messages of the assistant's turn."""
    return input_messages([{k: v for k, v in item.items() if k != "id"} for item in response["output"]])


def _format(body: ResponsesRequest) -> dict[str, Any] | None:
    fmt = body.text.format if body.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    schema = {"name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}
    return {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v is not None}}


def chat_request(body: ResponsesRequest, conversation: list[dict[str, Any]]) -> p.ChatCompletionRequest:
    """The chat request the Responses request means: instructions first, then the conversation."""
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    chat = {
        "model": body.model,
        "messages": [*system, *conversation],
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "tools": function_tools(body.tools),
        "tool_choice": chat_tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": _format(body),
        "speculation": body.speculation.model_dump(exclude_none=True) if body.speculation else None,
    }
    try:
        return p.ChatCompletionRequest.model_validate_json(json.dumps({k: v for k, v in chat.items() if v is not None}))
    except ValidationError as exc:
        error = exc.errors()[0]
        param = responses_param(".".join(str(part) for part in error["loc"])) or "input"
        raise APIError(400, f"invalid request: {error['msg']}", param=param, code="invalid_value") from None


@contextmanager
def in_responses_terms() -> Iterator[None]:
    """An APIError raised by the chat path, renamed to the Responses field it came from."""
    try:
        yield
    except APIError as exc:
        exc.param = responses_param(exc.param)
        exc.message = exc.message.replace("response_format", "text.format").replace(
            "max_completion_tokens", "max_output_tokens"
        )
        exc.message = re.sub(r"(tools\[\d+\])\.function\.", r"\1.", exc.message)
        exc.args = (exc.message,)
        raise


def responses_param(param: str | None) -> str | None:
    """A chat request's field as the Responses request's. Example: "tools[1].function.name" ->
    "tools[1].name"; "messages[3].content" -> "input"; "response_format" -> "text.format"."""
    if param is None:
        return None
    if param.startswith("messages"):
        return "input"  # instructions and the stored turns come first, so the indices differ
    if param.startswith("response_format"):
        return "text.format"
    if param in ("max_completion_tokens", "max_tokens"):
        return "max_output_tokens"
    return re.sub(r"^(tools\[\d+\]|tool_choice)\.function\.", r"\1.", param)
