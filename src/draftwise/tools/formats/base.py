"""What a tool-call format is (ToolFormat), and the shared kind most formats are: a trigger
text, then each call as a JSON object {"name": ..., "arguments": {...}} and a closing text
(JsonCallsFormat: its Lark grammar, built from the tools, and its streaming parser), and
BlockCalls, how that parser finds calls written as JSON blocks (their grammar: json_block.py).

A format module only names its texts (Hermes: "<tool_call>", "\\n", "\\n</tool_call>") and says
which chat templates are its own; one whose calls are shaped otherwise overrides grammar/parser.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from draftwise.tools.spec import Tool, ToolChoice

# JSON in calls is written with json.dumps' separators and no other whitespace (constraints.py
# JSON_OVERRIDES, for the same reason): chat templates render past calls with tojson, which
# writes the same. Non-strict tools get llguidance's lenient mode (schema keywords it does not
# support are ignored, as OpenAI does not enforce a non-strict schema).
ARGS_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the JSON text the model wrote for the arguments object

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Parsed:
    """An answer read as OpenAI's message: content (None when only calls) and the calls."""

    content: str | None
    calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class StreamEvent:
    """One delta: text content, or a call's start (index, id, name), or a fragment of its arguments."""

    content: str | None = None
    index: int | None = None
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def lark_literal(text: str) -> str:
    """A Lark string literal. Example: 'say "hi"\\n' -> '"say \\\\"hi\\\\"\\\\n"'."""
    return json.dumps(text, ensure_ascii=False)


def schema_for(tool: Tool) -> dict:
    """The arguments schema with llguidance's options; strict: objects allow no other keys
    unless they say so (OpenAI's strict mode)."""
    schema = json.loads(json.dumps(tool.parameters))  # a copy
    if tool.strict:
        _close_objects(schema)
    return {**schema, "x-guidance": {**ARGS_OPTIONS, "lenient": not tool.strict}}


def _close_objects(schema) -> None:
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        for value in schema.values():
            _close_objects(value)
    elif isinstance(schema, list):
        for value in schema:
            _close_objects(value)


class ToolFormat:
    """A model family's tool calls. `trigger` starts the calls (the lazy grammar's trigger; ""
    for a format whose calls are JSON objects only, found by their start: json_block.pattern).
    `tokens`: vocabulary tokens that mark the family where its template does not say (a GGUF
    answered with a built-in template)."""

    name: str = ""
    trigger: str = ""
    tokens: tuple[str, ...] = ()
    json_blocks: bool = False  # under auto, calls written as ```json blocks count too (json_block.py)
    trigger_optional: bool = False  # calls may come without the trigger (then as JSON objects), any tool_choice
    single: bool = False  # one call per answer (the family's template renders no more)
    arguments_key: str = "arguments"  # Llama 3.x writes "parameters"
    block_indents: tuple[int | None, ...] = (2, 4)  # how the model lays out a call's JSON (None: one line)

    def matches(self, template: str) -> bool:
        """Whether a chat template is this format's (it renders tools and calls this way)."""
        raise NotImplementedError

    def grammar(
        self,
        tools: Sequence[Tool],
        choice: ToolChoice,
        parallel: bool,
        tag: Callable[[str], str],
        *,
        lazy: bool,
        with_trigger: bool = True,
    ) -> str:
        """Lark grammar of the calls; lazy: of what follows the trigger, else trigger included
        (optional for a format whose calls may come without it; left out with with_trigger off).
        tag(text) is the Lark for a fixed text (a single token where the vocabulary has one)."""
        raise NotImplementedError

    def parser(self, blocks: BlockCalls | None = None) -> JsonCallsParser:
        raise NotImplementedError

    def calls_text(self, calls: Sequence[tuple[str, str]]) -> str:
        """Calls as the model writes them: (name, the JSON text of the arguments object) each."""
        raise NotImplementedError

    def parse(self, text: str, blocks: BlockCalls | None = None) -> Parsed:
        """A whole answer; if a call does not parse (cut short), the whole text is content.
        blocks: also read calls written as JSON blocks (ToolPlan.parse passes them under auto)."""
        parser = self.parser(blocks)
        parser.feed(text)
        parser.finish()
        if parser.broken or not parser.calls:
            return Parsed(text)
        return Parsed(parser.content or None, tuple(parser.calls))


class JsonCallsFormat(ToolFormat):
    """trigger + opener + {"name": "<name>", "<arguments_key>": <object>} + closer, calls joined
    by separator (each call starts with the trigger again); or, with a joiner, one trigger and
    the calls as a list: trigger + list_open + call (joiner call)* + list_close (Mistral's
    [TOOL_CALLS][{...}, {...}])."""

    opener: str = ""
    closer: str = ""
    separator: str = ""
    joiner: str = ""
    list_open: str = ""
    list_close: str = ""

    def grammar(
        self,
        tools: Sequence[Tool],
        choice: ToolChoice,
        parallel: bool,
        tag: Callable[[str], str],
        *,
        lazy: bool,
        with_trigger: bool = True,
    ) -> str:
        chosen = [t for t in tools if choice.mode != "named" or t.name == choice.name]
        many = parallel and choice.mode != "named" and not self.single
        # the trigger with a space after it, "" where there is none (plain JSON, or one the
        # vocabulary cannot spell: tools.plan)
        trigger = f"{tag(self.trigger)} " if self.trigger and with_trigger else ""
        head = "" if lazy else f"({trigger.strip()})? " if trigger and self.trigger_optional else trigger
        if self.joiner:
            more = f" ({lark_literal(self.joiner)} call)*" if many else ""
            body = f"{lark_literal(self.list_open)} call{more} {lark_literal(self.list_close)}"
        else:
            # NOTE: the separator may also end the answer: a model that writes it after a call has
            # not yet chosen between another call and the end, and forcing the trigger there made
            # the default target repeat its call until max_tokens.
            sep = lark_literal(self.separator)
            more = (
                f" ({sep} {trigger}call)* {sep}?" if many and self.separator else f" ({trigger}call)*" if many else ""
            )
            body = f"call{more}"
        closer = f" {_tagged(self.closer, tag)}" if self.closer else ""
        lines = [
            f"start: {head}{body}",
            f"call: {lark_literal(self.opener + '{')} fn {lark_literal('}')}{closer}",
            "fn: " + " | ".join(f"fn_{i}" for i in range(len(chosen))),
        ]
        for i, tool in enumerate(chosen):
            key = lark_literal(f'"name": {json.dumps(tool.name)}, "{self.arguments_key}": ')
            lines.append(f"fn_{i}: {key} args_{i}")
            lines.append(f"args_{i}: %json {json.dumps(schema_for(tool), ensure_ascii=False)}")
        return "\n".join(lines) + "\n"

    def parser(self, blocks: BlockCalls | None = None) -> JsonCallsParser:
        return JsonCallsParser(self, blocks)

    def calls_text(self, calls: Sequence[tuple[str, str]]) -> str:
        objects = [f'{{"name": {json.dumps(n, ensure_ascii=False)}, "{self.arguments_key}": {a}}}' for n, a in calls]
        if self.joiner:
            return f"{self.trigger}{self.list_open}{self.joiner.join(objects)}{self.list_close}"
        return self.separator.join(f"{self.trigger}{self.opener}{o}{self.closer}" for o in objects)


def _tagged(text: str, tag: Callable[[str], str]) -> str:
    """Lark for a closer such as "\\n</tool_call>": the tag part through tag(), the rest literal."""
    start = text.find("<")
    if start <= 0:
        return tag(text) if start == 0 else lark_literal(text)
    return f"{lark_literal(text[:start])} {tag(text[start:])}"


def _call_head(fmt: JsonCallsFormat) -> re.Pattern:
    """A call's start up to its arguments (the list's opening for a list format): the name is group 1."""
    opening = rf"(?:{re.escape(fmt.list_open)}\s*)?" if fmt.list_open else ""
    return re.compile(rf'\s*{opening}\{{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"{fmt.arguments_key}"\s*:\s*')


class JsonCallsParser:
    """Reads an answer piece by piece into content deltas and call deltas (a call's id and name
    once its name is complete, then its arguments as they arrive). Content that could be the
    start of the trigger, and whitespace before it, is held back until it is known not to be.
    blocks: calls may also come as JSON blocks (json_block.py), and text that could begin one is
    held back too."""

    def __init__(self, fmt: JsonCallsFormat, blocks: BlockCalls | None = None) -> None:
        self.fmt = fmt
        self._blocks = blocks
        self._head_re = _call_head(fmt)
        self._closer = self._call_closer()  # of the current call
        self._buf = ""
        self._mode = "text"  # text -> head -> args -> close -> between -> head ...
        self._steps: dict[str, Callable[[], StreamEvent | None]] = {
            "text": self._text,
            "head": self._head,
            "args": self._args,
            "close": self._close,
            "between": self._between,
        }
        self.content = ""
        self.calls: list[ToolCall] = []
        self._current: dict | None = None
        self._depth, self._in_string, self._escape = 0, False, False
        self.broken = False  # the answer ended inside a call

    def feed(self, text: str) -> list[StreamEvent]:
        self._buf += text
        events: list[StreamEvent] = []
        while True:
            step = self._steps[self._mode]()
            if step is None:
                return events
            if step.content or step.name or step.arguments:
                events.append(step)

    def finish(self) -> list[StreamEvent]:
        """The held text at the end of the answer."""
        if self._mode == "text" and self._buf:
            rest, self._buf = self._buf, ""
            self.content += rest
            return [StreamEvent(content=rest)]
        if self._mode in ("head", "args", "close"):
            self.broken = True
        return []

    # each mode reads what it can from the buffer: an event (maybe empty) or None (needs more text)
    def _text(self) -> StreamEvent | None:
        buf, trigger = self._buf, self.fmt.trigger
        at = buf.find(trigger) if trigger else -1
        block = self._blocks.regex.search(buf) if self._blocks is not None else None
        if block is not None and (at < 0 or block.start() < at):
            before = buf[: block.start()].rstrip()
            self._start_block(buf[block.start() :])
            self.content += before
            return StreamEvent(content=before)
        if at >= 0:
            before = buf[:at].rstrip()
            self._buf, self._mode = buf[at + len(trigger) :], "head"
            self._closer = self._call_closer()
            self.content += before
            return StreamEvent(content=before)
        hold = next((n for n in range(min(len(trigger) - 1, len(buf)), 0, -1) if trigger.startswith(buf[-n:])), 0)
        if self._blocks is not None:
            starts = (i for i in range(max(0, len(buf) - 256), len(buf)) if buf[i] in "`{")
            hold = max(hold, next((len(buf) - i for i in starts if self._blocks.could_start(buf[i:])), 0))
        emit = buf[: len(buf) - hold].rstrip()
        if not emit:
            return None
        self._buf = buf[len(emit) :]
        self.content += emit
        return StreamEvent(content=emit)

    def _head(self) -> StreamEvent | None:
        match = self._head_re.match(self._buf)
        if match is None or match.end() == len(self._buf):  # the arguments have not begun yet
            return None
        name = json.loads(f'"{match.group(1)}"')
        self._buf, self._mode = self._buf[match.end() :], "args"
        self._current = {"id": new_call_id(), "name": name, "arguments": ""}
        self._depth, self._in_string, self._escape = 0, False, False
        return StreamEvent(index=len(self.calls), id=self._current["id"], name=name)

    def _args(self) -> StreamEvent | None:
        if not self._buf:
            return None
        end = None
        for i, ch in enumerate(self._buf):
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    end = i + 1
                    break
        piece = self._buf if end is None else self._buf[:end]
        self._buf = self._buf[len(piece) :]
        self._current["arguments"] += piece
        if end is not None:
            self._mode = "close"
        return StreamEvent(index=len(self.calls), arguments=piece)

    def _start_block(self, text: str) -> None:
        """Read a JSON-block call from its start (the fence, if any, and the object)."""
        fence = self._blocks.fence.match(text)
        self._closer = re.compile(r"\s*\}\s*```" if fence else r"\s*\}")
        self._buf, self._mode = text[fence.end() :] if fence else text, "head"

    def _close(self) -> StreamEvent | None:
        closed = self._closer.match(self._buf)
        if closed is None:
            return None
        self._buf = self._buf[closed.end() :]
        self.calls.append(ToolCall(**self._current))
        # a list format's joiner: the next call of the list follows, without the trigger
        self._current, self._mode = None, "head" if closed.groupdict().get("more") else "between"
        return StreamEvent()

    def _call_closer(self) -> re.Pattern:
        """The end of a call after the trigger: "}" and the closer; for a list format, "}" and
        the joiner (group "more": another call follows) or the list's end."""
        fmt = self.fmt
        if fmt.joiner:
            joiner, end = re.escape(fmt.joiner.strip()), re.escape(fmt.list_close)
            return re.compile(rf"\s*\}}\s*(?:(?P<more>{joiner})\s*|{end})")
        return re.compile(r"\s*" + re.escape("}" + fmt.closer))

    def _between(self) -> StreamEvent | None:
        stripped, trigger = self._buf.lstrip(), self.fmt.trigger
        if trigger and stripped.startswith(trigger):
            self._buf, self._mode = stripped[len(trigger) :], "head"
            self._closer = self._call_closer()
            return StreamEvent()
        if self._blocks is not None and self._blocks.regex.match(stripped):
            self._start_block(stripped)
            return StreamEvent()
        if self._blocks is not None and self._blocks.could_start(stripped):
            return None
        if stripped and not (trigger and trigger.startswith(stripped)):
            self._buf = ""  # text after the calls (no grammar allows it) is not part of the message
        return None


# ---------------------------------------------------------------------- calls as JSON blocks
# Whitespace between the block's parts is the model's own (it indents), but bounded: unbounded
# whitespace in a grammar lets a model write spaces until max_tokens.
WS = r"[ \t\n]{0,16}"
FENCE = r"```(?:json)?[ \t]*\n"


def pattern(names: Sequence[str]) -> str:
    """The regex of a call's start, up to its name's closing quote. Example, names ["f"]:
    matches '```json\\n{\\n  "name": "f"' and '{"name": "f"', not '{"name": "g"'."""
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return rf'(?:{FENCE}{WS})?\{{{WS}"name"{WS}:{WS}"(?:{alternatives})"'


class BlockCalls:
    """What a parser needs to read block calls of these tools: find() their starts, the fence a
    start opens with, and could_start(), whether a text is a prefix of a start (the pattern cut
    anywhere). Example, names ["f"]: "```js", '{ "na' and '{"name": "' could; '{"x' and "```py" not."""

    def __init__(self, names: Sequence[str]) -> None:
        self.regex = re.compile(pattern(names))
        self.fence = re.compile(FENCE + WS)
        ws = (WS, None)
        call = [_literal("{"), ws, _literal('"name"'), ws, _literal(":"), ws, _literal('"'), _names(names)]
        fences = [[_literal(f), (r"[ \t]*", None), _literal("\n"), ws] for f in ("```json", "```")]
        forms = [_chain(f + call) for f in fences] + [_chain(call)]
        self._prefix = re.compile("|".join(forms))

    def could_start(self, text: str) -> bool:
        return self._prefix.fullmatch(text) is not None


def _literal(text: str) -> tuple[str, str]:
    """(the regex of text, the regex of its proper non-empty prefixes)."""
    return re.escape(text), "|".join(re.escape(text[:i]) for i in range(1, len(text))) or None


def _names(names: Sequence[str]) -> tuple[str, str | None]:
    prefixes = sorted({n[:i] for n in names for i in range(1, len(n))})
    return "|".join(re.escape(n) for n in names), "|".join(re.escape(p) for p in prefixes) or None


def _chain(atoms: list[tuple[str, str | None]]) -> str:
    """Regex of the prefixes of atoms in a row: each atom whole then (maybe) more, or cut inside."""
    out = ""
    for whole, cut in reversed(atoms):
        whole_then = f"(?:{whole})(?:{out})?" if out else f"(?:{whole})"
        out = f"{whole_then}|(?:{cut})" if cut else whole_then
        out = f"(?:{out})"
    return out
