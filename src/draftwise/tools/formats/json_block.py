"""Calls written as a Markdown JSON block, as Qwen2.5-Coder answers a tool prompt under tool_choice
auto instead of with <tool_call>:

    ```json
    {
      "name": "read_file",
      "arguments": {
        "path": "README.md"
      }
    }
    ```

(or the bare object). llama.cpp's Hermes handler takes these with a pattern trigger; so does the
lazy grammar (constraints.PatternTrigger): pattern() finds the start of a call (an object whose
"name" is one of the tools), grammar() holds from that match's start, and BlockCalls lets the
parser find calls and tell which text could still become one (held back until known).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from draftwise.tools.formats.base import FENCE, WS, BlockCalls, lark_literal, pattern, schema_for
from draftwise.tools.spec import Tool, ToolChoice
from draftwise.types import CALL_ANY, CALL_HOLE

# The start of a call and its reader live in base.py (the parser there reads block calls).
__all__ = ["FENCE", "WS", "BlockCalls", "calls", "grammar", "pattern"]

# NOTE: the separators without their space: ", " would refuse the model's `",\n` tokens and make it
# write "\n  , " (seen on the default target with the bench's edit_file prompt).
WS_OPTIONS = {
    "whitespace_flexible": True,
    "whitespace_pattern": r"[ \t\n]{1,16}",
    "item_separator": ",",
    "key_separator": ":",
}


def grammar(tools: Sequence[Tool], choice: ToolChoice, parallel: bool, key: str = "arguments") -> str:
    """Lark grammar of the calls from the match's start: fenced blocks (several, whitespace
    between, when parallel) or one bare object; each {"name": <a tool>, <key>: <its schema>}."""
    chosen = [t for t in tools if choice.mode != "named" or t.name == choice.name]
    many = parallel and choice.mode != "named"
    lines = [
        "start: fenced (WS? fenced)* | call" if many else "start: fenced | call",
        'fenced: FENCE WS? call WS? "```"',
        f"FENCE: /{FENCE}/",
        f"WS: /{WS.replace('{0,', '{1,')}/",
        'call: "{" WS? "\\"name\\"" WS? ":" WS? fn WS? "}"',
        "fn: " + " | ".join(f"fn_{i}" for i in range(len(chosen))),
    ]
    for i, tool in enumerate(chosen):
        name = lark_literal(json.dumps(tool.name))
        lines.append(f'fn_{i}: {name} WS? "," WS? "\\"{key}\\"" WS? ":" WS? args_{i}')
        schema = schema_for(tool)
        schema["x-guidance"] = {**schema["x-guidance"], **WS_OPTIONS}
        lines.append(f"args_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
    return "\n".join(lines) + "\n"


def calls(
    tools: Sequence[Tool], choice: ToolChoice, key: str = "arguments", indents: Sequence[int | None] = (2, 4)
) -> tuple[str, ...]:
    """Each tool's call as the model writes it (Constraint.calls, for the calls drafter): fenced
    and bare, laid out by each of indents in turn (None: on one line, as json.dumps writes it),
    the arguments in the schema's order, string values as CALL_HOLE and others as CALL_ANY.
    Example, a tool f(path: string), fenced, indent 2:
    '```json\n{\n  "name": "f",\n  "arguments": {\n    "path": "<HOLE>"\n  }\n}\n```'."""
    hole, other = "@@draftwise-hole@@", "@@draftwise-any@@"
    calls = []
    for tool in tools:
        if choice.mode == "named" and tool.name != choice.name:
            continue
        properties = (tool.parameters or {}).get("properties") or {}
        arguments = {prop: hole if _string(spec) else other for prop, spec in properties.items()}
        calls.append({"name": tool.name, key: arguments})
    out = []
    # The likeliest style first (the default target's: fenced, indent 2).
    for indent in indents:
        texts = [
            json.dumps(call, indent=indent, ensure_ascii=False).replace(hole, CALL_HOLE).replace(f'"{other}"', CALL_ANY)
            for call in calls
        ]
        out += [f"```json\n{text}\n```" for text in texts] + texts
    return tuple(out)


def _string(spec) -> bool:
    """Whether a property's schema makes its value a string (a string type, or an enum of strings)."""
    if not isinstance(spec, dict):
        return False
    values = spec.get("enum")
    return spec.get("type") == "string" or (bool(values) and all(isinstance(v, str) for v in values))
