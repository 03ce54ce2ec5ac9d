"""A tool request as the engine decodes it: the model's format, and the Constraint for its
tool_choice (none: text without the trigger; auto: lazy, free text until the trigger, then the
calls, or for a format that takes them, until a JSON block that calls a tool; required / named:
the calls from the first token)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from draftwise.constraints import Constraint
from draftwise.tools.formats import ToolFormat, format_for, json_block
from draftwise.tools.formats.base import JsonCallsParser, Parsed, lark_literal
from draftwise.tools.formats.json_block import BlockCalls
from draftwise.tools.spec import Tool, ToolChoice, ToolSpecError


@dataclass(frozen=True)
class ToolPlan:
    format: ToolFormat
    tools: tuple[Tool, ...]
    choice: ToolChoice
    constraint: Constraint
    blocks: BlockCalls | None = None  # calls may come as JSON blocks (auto, a format that takes them)

    def parse(self, text: str) -> Parsed:
        """The answer's content and calls, read as this plan's constraint allows them."""
        return self.format.parse(text, self.blocks)

    def parser(self) -> JsonCallsParser:
        return self.format.parser(self.blocks)


def tool_plan(tokenizer, tools: Sequence[Tool], choice: ToolChoice, parallel: bool = True) -> ToolPlan:
    """The format of the tokenizer's chat template and the constraint of the request. A template
    without tool support is refused (ToolSpecError on `tools`): see docs/tools-and-structured-output.md."""
    fmt = format_for(tokenizer.chat_template)
    if fmt is None:
        raise ToolSpecError(
            "this model's chat template has no tool support (no tool-call format this server "
            "knows), so it cannot take tools",
            "tools",
        )

    def tag(text: str) -> str:
        ids = tokenizer.encode(text, add_special=False, parse_special=True)
        if len(ids) == 1 and tokenizer.decode(ids) == text:
            return f"<[{ids[0]}]>"  # the token itself: its text in pieces is not the tag
        return lark_literal(text)

    if choice.mode == "none":
        constraint = Constraint.without(fmt.trigger)
    else:
        grammar = Constraint.grammar(fmt.grammar(tools, choice, parallel, tag, lazy=choice.mode == "auto"))
        constraint = Constraint.lazy(grammar, fmt.trigger) if choice.mode == "auto" else grammar
    blocks = None
    if choice.mode == "auto" and fmt.json_blocks:
        names = [t.name for t in tools]
        blocks = BlockCalls(names)
        from_block = Constraint.grammar(json_block.grammar(tools, choice, parallel))
        constraint = Constraint.lazy(grammar, fmt.trigger, pattern=json_block.pattern(names), from_pattern=from_block)
        constraint = replace(constraint, calls=json_block.calls(tools, choice))
    return ToolPlan(fmt, tuple(tools), choice, constraint, blocks)
