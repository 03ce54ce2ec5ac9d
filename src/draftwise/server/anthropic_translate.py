"""Anthropic's Messages requests -> the engine's request (prepared.EngineRequest), beside
translate.py's OpenAI translator: `system` and the content blocks as the OpenAI-shaped messages
chat templates read (tool_use -> an assistant's tool_calls, tool_result -> a tool message),
`tools` / `tool_choice` as the same tool plan /v1/chat/completions decodes under (tools.py),
and max_tokens, temperature, top_p, top_k and stop_sequences as SamplingParams; `translate`
does it once per request, with the MessagesReply the answer reads.

Every refusal is an APIError whose param names the field; anthropic_routes words it as
Anthropic's error.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from draftwise.constraints import Constraint, llguidance_tokenizer
from draftwise.engine import Engine
from draftwise.server import names as model_names
from draftwise.server.anthropic_protocol import Block, CountTokensRequest, MessagesRequest
from draftwise.server.errors import APIError
from draftwise.server.prepared import EngineRequest, Prepared, Reply
from draftwise.server.tools import ChatTools, enforceable
from draftwise.server.translate import refusals, speculation
from draftwise.tools import parse_tool_choice, parse_tools, template_messages, tool_plan
from draftwise.tools.spec import ToolSpecError
from draftwise.types import SamplingParams

# Blocks of earlier assistant turns that carry no text for the prompt: a reasoning model's
# thinking, which Anthropic's API also leaves out of earlier turns.
_DROPPED = ("thinking", "redacted_thinking")
_MEDIA = ("image", "document", "search_result")


def check_model(requested: str, served: str, names: Sequence[str] = ()) -> None:
    """404 unless `requested` names the served model (any of its names, see server/names.py)."""
    if not model_names.answers_to(requested, served, names):
        raise APIError(
            404,
            f"model: {model_names.quoted(requested)} does not exist; this server serves {served!r}",
            param="model",
            code="not_found",
        )


# thinking types a model that never thinks honours: off, or the model's own choice (adaptive).
_THINKING_HONOURED = ("disabled", "adaptive")


def refuse_unsupported(body: CountTokensRequest) -> None:
    """thinking that asks for reasoning (enabled, between_tools; draftwise serves no reasoning
    model): a 400 naming it; disabled and adaptive (the model decides, and this one does not think) are fine."""
    if body.thinking is not None and body.thinking.type not in _THINKING_HONOURED:
        raise APIError(
            400,
            f"thinking is not supported: {body.model!r} is not a reasoning model; leave thinking out "
            '(or send {"type": "disabled"})',
            param="thinking",
            code="unsupported_parameter",
        )


def chat_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    """system and messages -> OpenAI-shaped chat messages.
    Example: [user [tool_result(t1, "11 C"), text "thanks"]] -> [tool (t1) "11 C", user "thanks"]."""
    out: list[dict[str, Any]] = []
    if body.system:
        out.append({"role": "system", "content": _text(body.system, "system")})
    for i, message in enumerate(body.messages):
        where = f"messages.{i}.content"
        if message.role == "system":
            out.append({"role": "system", "content": _text(message.content, where)})
            continue
        blocks = [Block(type="text", text=message.content)] if isinstance(message.content, str) else message.content
        texts, calls = [], []
        for j, block in enumerate(blocks):
            kind = block.type
            if kind == "text":
                texts.append(_block_text(block, f"{where}.{j}"))
            elif kind == "tool_use" and message.role == "assistant":
                if not block.id or not block.name:
                    raise APIError(
                        400, "a tool_use block needs id and name", param=f"{where}.{j}", code="invalid_value"
                    )
                call = {"name": block.name, "arguments": block.input or {}}
                calls.append({"id": block.id, "type": "function", "function": call})
            elif kind == "tool_result" and message.role == "user":
                if texts:
                    raise APIError(
                        400,
                        "tool_result blocks must come before any text in a user message",
                        param=f"{where}.{j}",
                        code="invalid_value",
                    )
                result = "" if block.content is None else _text(block.content, f"{where}.{j}.content")
                out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": result})
            elif kind in _DROPPED and message.role == "assistant":
                continue
            else:
                raise _refused_block(kind, message.role, f"{where}.{j}")
        if message.role == "assistant":
            out.append({"role": "assistant", "content": "".join(texts), **({"tool_calls": calls} if calls else {})})
        elif texts or isinstance(message.content, str):
            out.append({"role": "user", "content": "".join(texts)})
    return out


def _text(content: str | list[Block], where: str) -> str:
    """A string, or text blocks joined."""
    if isinstance(content, str):
        return content
    for j, block in enumerate(content):
        if block.type != "text":
            raise _refused_block(block.type, None, f"{where}.{j}")
    return "".join(_block_text(block, f"{where}.{j}") for block in content)


def _block_text(block: Block, where: str) -> str:
    """A text block's text, which Anthropic requires."""
    if block.text is None:
        raise APIError(400, "Field required", param=f"{where}.text", code="invalid_value")
    return block.text


def _refused_block(kind: str, role: str | None, where: str) -> APIError:
    if kind in _MEDIA:
        why = f"{kind} blocks are not supported by this server: draftwise serves text-only models"
        return APIError(400, why, param=where, code="unsupported_value")
    placed = f" in a {role} message" if role else " here"
    return APIError(400, f"a {kind!r} block is not supported{placed}", param=where, code="unsupported_value")


def chat_tools(body: CountTokensRequest, tokenizer, messages: list[dict]) -> tuple[ChatTools | None, list[dict]]:
    """tools and tool_choice as the plan of /v1/chat/completions' tools (OpenAI's function tools:
    input_schema is the parameters; any is required, tool a named function, none no calls)."""
    choice = body.tool_choice
    try:
        messages = template_messages(messages)
        if not body.tools:
            if choice is not None and choice.type in ("any", "tool"):
                raise ToolSpecError(f"tool_choice {choice.type!r} needs tools", "tool_choice")
            return None, messages
        if isinstance(body, MessagesRequest) and body.output_config and body.output_config.format:
            raise ToolSpecError("give tools or output_config.format, not both", "output_config.format")
        for i, tool in enumerate(body.tools):
            if tool.type not in (None, "custom"):
                raise ToolSpecError(
                    f"tool type {tool.type!r} is an Anthropic server tool, which this server does not run; "
                    "give client tools (name, description, input_schema)",
                    f"tools.{i}.type",
                )
            if tool.input_schema is None:
                raise ToolSpecError("Field required", f"tools.{i}.input_schema")
        tools = enforceable(
            parse_tools(
                [
                    {
                        "type": "function",
                        "function": {
                            "name": t.name,
                            "description": t.description or "",
                            "parameters": t.input_schema,
                            **({"strict": t.strict} if t.strict is not None else {}),
                        },
                    }
                    for t in body.tools
                ]
            )
        )
        parallel = not (choice and choice.disable_parallel_tool_use)
        plan = tool_plan(tokenizer, tools, parse_tool_choice(_openai_choice(choice), tools), parallel)
    except ToolSpecError as exc:
        param, message = _anthropic_names(exc.param), _anthropic_names(str(exc))
        message = message if param in message else f"{param}: {message}"
        raise APIError(400, message, param=param, code="invalid_value") from None
    return ChatTools(plan, [t.as_openai() for t in tools]), plan.messages(messages)


def _anthropic_names(text: str) -> str:
    """The OpenAI field names of draftwise.tools' errors as the Messages request's. Example:
    "tools[1].function.parameters" -> "tools.1.input_schema"; "tool_choice.function.name" -> "tool_choice.name"."""
    text = re.sub(r"tools\[(\d+)\]\.function\.parameters", r"tools.\1.input_schema", text)
    text = re.sub(r"tools\[(\d+)\](\.function)?", r"tools.\1", text)
    return text.replace("tool_choice.function.name", "tool_choice.name")


def _openai_choice(choice) -> Any:
    if choice is None or choice.type == "auto":
        return "auto"
    if choice.type == "any":
        return "required"
    if choice.type == "none":
        return "none"
    if not choice.name:
        raise ToolSpecError('tool_choice of type "tool" needs a name', "tool_choice.name")
    return {"type": "function", "function": {"name": choice.name}}


@dataclasses.dataclass(frozen=True)
class MessagesReply(Reply):
    """How a /v1/messages request is answered: its stop sequences (stop_reason names the one that
    ended the answer)."""

    stop: tuple[str, ...] = ()


def translate(engine: Engine, body: MessagesRequest, served: tuple[str, Sequence[str]]) -> Prepared[MessagesReply]:
    """A /v1/messages request, translated once: its messages and tools, the engine's request and
    the reply. It tokenises: routes run it in a worker thread; a library error is the APIError of
    errors.openai_refusal."""
    check_model(body.model, *served)
    refuse_unsupported(body)
    tools, chat = chat_tools(body, engine.tokenizer, chat_messages(body))
    constraint = constraint_param(tools)
    with refusals("messages", constraint):
        request = messages_request(engine, body, chat, tools)
    reply = MessagesReply(stream=body.stream, constraint_param=constraint, stop=request.sampling.stop)
    return Prepared((request,), reply, tools)


def prompt_ids(engine: Engine, messages: list[dict], tools: ChatTools | None) -> list[int]:
    return engine.encode_prompt(None, messages, tools.rendered if tools else None)


def messages_request(
    engine: Engine, body: MessagesRequest, messages: list[dict], tools: ChatTools | None
) -> EngineRequest:
    """The engine's request: the prompt through the chat template, up to max_tokens within the
    room the context leaves (a prompt that fills it is a 400: "prompt is too long")."""
    ids = prompt_ids(engine, messages, tools)
    n_ctx = engine.target.n_ctx
    if len(ids) >= n_ctx:
        raise APIError(
            400,
            f"prompt is too long: {len(ids)} tokens > {n_ctx - 1} maximum (this server's context holds {n_ctx})",
            param="messages",
            code="context_length_exceeded",
        )
    constraint = tools.plan.constraint if tools else _output_constraint(body)
    if constraint is not None:  # the model's tokenizer adapter, built once
        llguidance_tokenizer(engine.target)
    # NOTE: max_tokens is capped by the context's room rather than refused: clients such as Claude
    # Code ask for 32000 whatever the model; an answer the cap ends says stop_reason "max_tokens".
    sampling = SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,  # Anthropic's default
        top_k=body.top_k or 0,
        top_p=1.0 if body.top_p is None else body.top_p,
        max_tokens=min(body.max_tokens, n_ctx - len(ids)),
        stop=tuple(s for s in body.stop_sequences or () if s),
        constraint=constraint,
    )
    config, drafters = speculation(body.speculation, engine.speculation)
    return EngineRequest(ids, sampling, config, drafters)


def constraint_param(tools: ChatTools | None) -> str:
    """The field the request's constraint came from: its tools, else output_config.format."""
    return "tools" if tools else "output_config.format"


def _output_constraint(body: MessagesRequest) -> Constraint | None:
    """output_config.format (structured output) as the JSON-schema constraint of response_format."""
    fmt = body.output_config.format if body.output_config else None
    return None if fmt is None else Constraint.json_schema(fmt.schema_)
