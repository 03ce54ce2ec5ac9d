"""A tool request as the engine decodes it: the model's format, and the Constraint for its
tool_choice (none: text without the trigger; auto: lazy, free text until the trigger, then the
calls, or for a format that takes them, until a JSON object that calls a tool; required / named:
the calls from the first token). A model whose template does not lay out tools gets them
described in a system message (messages()), its past calls written as its format writes them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

from draftwise.constraints import Constraint
from draftwise.tools.formats import ToolFormat, choose_format, json_block, renders_tools, vocabulary_has
from draftwise.tools.formats.base import JsonCallsParser, Parsed, lark_literal
from draftwise.tools.formats.json_block import BlockCalls
from draftwise.tools.spec import Tool, ToolChoice


@dataclass(frozen=True)
class ToolPlan:
    format: ToolFormat
    tools: tuple[Tool, ...]
    choice: ToolChoice
    constraint: Constraint | None  # None: no constraint (tool_choice none, a format without a trigger)
    blocks: BlockCalls | None = None  # calls may come as JSON objects (auto, or a format whose trigger is optional)
    templated: bool = True  # the chat template lays out the tools (else messages() describes them)

    def parse(self, text: str) -> Parsed:
        """The answer's content and calls, read as this plan's constraint allows them."""
        if self.choice.mode == "none":
            return Parsed(text)
        return self.format.parse(text, self.blocks)

    def parser(self) -> JsonCallsParser:
        return self.format.parser(self.blocks if self.choice.mode != "none" else None)

    def messages(self, messages: Sequence[dict]) -> list[dict]:
        """The messages to render: as given where the template lays out tools (or none may be
        called); else with the tools and how to call them in a system message, past calls as the
        format writes them and tool results as user turns (a built-in template has no place for
        either)."""
        if self.templated or self.choice.mode == "none":
            return list(messages)
        return untemplated(self.format, self.tools, self.choice, messages)


def tool_plan(tokenizer, tools: Sequence[Tool], choice: ToolChoice, parallel: bool = True) -> ToolPlan:
    """The format the model speaks (tools.formats.choose_format) and the constraint of the request."""
    fmt = choose_format(tokenizer.chat_template, vocabulary_has(tokenizer))
    templated = renders_tools(tokenizer.chat_template)
    names = [t.name for t in tools if choice.mode != "named" or t.name == choice.name]
    if choice.mode == "none":
        constraint = Constraint.without(fmt.trigger) if fmt.trigger else None
        return ToolPlan(fmt, tuple(tools), choice, constraint, None, templated)

    def tag(text: str) -> str:
        ids = tokenizer.encode(text, add_special=False, parse_special=True)
        if len(ids) == 1 and tokenizer.decode(ids) == text:
            return f"<[{ids[0]}]>"  # the token itself: its text in pieces is not the tag
        return lark_literal(text)

    auto = choice.mode == "auto"
    blocks = BlockCalls(names) if fmt.json_blocks and (auto or fmt.trigger_optional) else None
    # an optional trigger the vocabulary cannot spell is left out (the calls come as JSON objects)
    spelled = tokenizer.decode(tokenizer.encode(fmt.trigger, add_special=False, parse_special=True)) == fmt.trigger
    trigger = fmt.trigger if spelled or not fmt.trigger_optional else ""
    if not auto:  # the calls from the first token, written as the format writes them
        grammar = fmt.grammar(tools, choice, parallel, tag, lazy=False, with_trigger=bool(trigger))
        constraint = Constraint.grammar(grammar)
    else:
        pattern = {}  # where calls may come as JSON objects: found by their start (json_block.pattern)
        if blocks is not None:
            many = parallel and not fmt.single
            from_block = Constraint.grammar(json_block.grammar(tools, choice, many, fmt.arguments_key))
            pattern = {"pattern": json_block.pattern(names), "from_pattern": from_block}
        if trigger:
            grammar = Constraint.grammar(fmt.grammar(tools, choice, parallel, tag, lazy=True))
            constraint = Constraint.lazy(grammar, trigger, **pattern)
        else:  # calls only as JSON objects
            constraint = Constraint.lazy(pattern["from_pattern"], "", **pattern)
    if blocks is not None:
        constraint = replace(constraint, calls=json_block.calls(tools, choice, fmt.arguments_key, fmt.block_indents))
    return ToolPlan(fmt, tuple(tools), choice, constraint, blocks, templated)


def untemplated(fmt: ToolFormat, tools: Sequence[Tool], choice: ToolChoice, messages: Sequence[dict]) -> list[dict]:
    """messages for a template that lays out no tools (see ToolPlan.messages). Example, plain JSON:
    [user "hi"] -> [system "You can call these tools: ...", user "hi"]."""
    offered = [t for t in tools if choice.mode != "named" or t.name == choice.name]
    listing = "\n".join(json.dumps(t.as_openai()["function"], ensure_ascii=False) for t in offered)
    example = fmt.calls_text([("<tool name>", "{<its arguments>}")])
    must = "You must call a tool" if choice.mode != "auto" else "To call a tool, answer with"
    guide = (
        f"You can call these tools (the JSON schema of each one's arguments is its parameters):\n{listing}\n\n"
        f"{must} {example if choice.mode == 'auto' else 'as ' + example} and nothing else."
    )
    out: list[dict] = []
    names: dict[str, str] = {}  # tool_call_id -> the tool's name
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = [(c["function"]["name"], json.dumps(c["function"]["arguments"])) for c in message["tool_calls"]]
            names.update({c.get("id"): c["function"]["name"] for c in message["tool_calls"] if c.get("id")})
            text = "\n".join(t for t in (_text(message.get("content")), fmt.calls_text(calls)) if t)
            out.append({"role": "assistant", "content": text})
        elif role == "tool":
            result = f"{names.get(message.get('tool_call_id'), 'the tool')} returned: {_text(message.get('content'))}"
            if out and out[-1].get("tool_results"):  # results of one turn's calls: one user turn
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + result}
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
        else:
            out.append(dict(message))
    out = [{k: v for k, v in m.items() if k != "tool_results"} for m in out]
    if out and out[0].get("role") == "system":
        return [{**out[0], "content": f"{_text(out[0].get('content'))}\n\n{guide}"}, *out[1:]]
    return [{"role": "system", "content": guide}, *out]


def _text(content) -> str:
    """A message's content as text (OpenAI's list of parts: its text parts joined)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""
