"""Calls written as ```json blocks (tools/formats/json_block.py), as Qwen2.5-Coder writes them
under tool_choice auto: the plan's pattern trigger and grammar, the parser (whole answers, and the
same answers fed in every split), and which texts could still begin a call."""

import json
import re
from types import SimpleNamespace

import pytest

from draftwise.backends.hf_tokenizers import ByteTokenizer
from draftwise.constraints import Constraint, compile_constraint
from draftwise.tools import ToolChoice, parse_tools, tool_plan
from draftwise.tools.formats import json_block
from draftwise.tools.formats.hermes import HermesFormat
from draftwise.tools.formats.json_block import BlockCalls

TOOLS = parse_tools(
    [
        {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}},
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string", "maxLength": 12}},
                    "required": ["path"],
                },
            },
        },
    ]
)
BLOCKS = BlockCalls([t.name for t in TOOLS])
HERMES = HermesFormat()
# The default target's answer to "Show me README.md." under auto, as it writes it
MODEL_BLOCK = '```json\n{\n  "name": "read_file",\n  "arguments": {\n    "path": "README.md"\n  }\n}\n```'
ANSWERS = {
    "the model's block": (MODEL_BLOCK, None, [("read_file", '{\n    "path": "README.md"\n  }')]),
    "text then a bare call": ('Sure: {"name": "read", "arguments": {}}', "Sure:", [("read", "{}")]),
    "two blocks": (
        MODEL_BLOCK + "\n\n```\n" + '{"name": "read", "arguments": {"x": "}"}}\n```',
        None,
        [("read_file", '{\n    "path": "README.md"\n  }'), ("read", '{"x": "}"}')],
    ),
    "a block that calls no tool": ('```json\n{"name": "Alice", "age": 31}\n```', None, []),
    "a code block": ("```python\nd = {'name': 'read'}\n```", None, []),
}


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_parse_block_answers(case):
    text, content, calls = ANSWERS[case]
    parsed = HERMES.parse(text, BLOCKS)
    assert [(c.name, c.arguments) for c in parsed.calls] == calls
    assert parsed.content == (content if calls else text)
    for call in parsed.calls:
        json.loads(call.arguments)
    assert HERMES.parse(text).calls == ()  # without blocks (required, named, none) a block is text


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_streamed_block_answers_assemble_into_the_whole_parse(case):
    text, _, calls = ANSWERS[case]
    whole = HERMES.parse(text, BLOCKS)
    for size in (1, 2, 5, len(text)):
        parser, events = HERMES.parser(BLOCKS), []
        for i in range(0, len(text), size):
            events += parser.feed(text[i : i + size])
        events += parser.finish()
        streamed = "".join(e.content or "" for e in events)
        assert streamed == (whole.content or ""), size  # no piece of a call leaks into content
        assert [e.name for e in events if e.name] == [c[0] for c in calls]
        arguments = {}
        for e in events:
            if e.arguments:
                arguments[e.index] = arguments.get(e.index, "") + e.arguments
        assert [arguments[i] for i in sorted(arguments)] == [c[1] for c in calls]


def test_which_texts_could_still_begin_a_call():
    could = ["`", "```js", "```json\n", "```\n  {", '{ "na', '{"name": "', '{"name": "read_fi', '{"name":"read']
    cannot = ['{"x', "```py", '{"name": "write', '{"name": 1', "```json\nhello", '{"name": "read_file" ']
    assert [t for t in could if not BLOCKS.could_start(t)] == []
    assert [t for t in cannot if BLOCKS.could_start(t)] == []
    assert BLOCKS.regex.search('x ```json\n{"name": "read"').start() == 2
    assert BLOCKS.regex.search('{"name": "reader"') is None


def byte_backend():
    return SimpleNamespace(tokenizer=ByteTokenizer(257, [256]), vocab_size=257)


def test_the_block_grammar_reads_the_models_block_and_holds_the_schema():
    grammar = Constraint.grammar(json_block.grammar(TOOLS, ToolChoice("auto"), parallel=True))
    backend = byte_backend()

    def valid(text: str) -> int:  # characters the grammar accepts (all ASCII: one byte each)
        return compile_constraint(grammar, backend).valid_prefix(backend.tokenizer.encode(text))

    keys = '{"name": "read", "arguments": {\n    "a": "x",\n    "b": [1,2]\n  }}'  # the model's separators
    for text in (MODEL_BLOCK, ANSWERS["two blocks"][0], '{"name": "read", "arguments": {}}', keys):
        assert valid(text) == len(text), text
    too_long = MODEL_BLOCK.replace("README.md", "docs/README.md")  # maxLength 12
    assert valid(too_long) == too_long.index("docs/") + 12
    assert valid('{"name": "write"') == len('{"name": "')
    spaces = '{"name": "read",' + " " * 20
    assert valid(spaces) == len(spaces) - 4  # whitespace is bounded (16)
    single = Constraint.grammar(json_block.grammar(TOOLS, ToolChoice("auto"), parallel=False))
    two = ANSWERS["two blocks"][0]
    assert compile_constraint(single, backend).valid_prefix(backend.tokenizer.encode(two)) == len(MODEL_BLOCK)


def test_only_auto_takes_blocks():
    tokenizer = SimpleNamespace(
        chat_template="{{ tools }} <tool_call>",
        encode=lambda text, **_: [1] if text == "<tool_call>" else [2, 3],
        decode=lambda ids: "<tool_call>",
    )
    auto = tool_plan(tokenizer, TOOLS, ToolChoice("auto"))
    assert auto.blocks is not None and auto.constraint.trigger == "<tool_call>"
    assert re.search(auto.constraint.pattern, MODEL_BLOCK).start() == 0
    assert [c.name for c in auto.parse(MODEL_BLOCK).calls] == ["read_file"]
    for choice in ("required", "none"):
        plan = tool_plan(tokenizer, TOOLS, ToolChoice(choice))
        assert plan.blocks is None and not plan.constraint.pattern
        assert plan.parse(MODEL_BLOCK).calls == ()
