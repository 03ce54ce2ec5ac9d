"""draftwise.tools: the Hermes parser (whole answers, and the same answers fed in every split),
the grammar a plan compiles to on the toy vocabulary, and the checks of tools and messages."""

import json

import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.constraints import compile_constraint
from draftwise.tools import ToolChoice, parse_tool_choice, parse_tools, template_messages, tool_plan
from draftwise.tools.formats import format_for
from draftwise.tools.formats.hermes import HermesFormat
from draftwise.tools.spec import ToolSpecError

HERMES = HermesFormat()
CALL = '<tool_call>\n{"name": "f", "arguments": {"s": "a}\\"<tool_call>", "n": [1, {"k": 2}]}}\n</tool_call>'
ANSWERS = {
    "text only": ("No tool needed <tool", "No tool needed <tool", []),
    "one call": (CALL, None, [("f", '{"s": "a}\\"<tool_call>", "n": [1, {"k": 2}]}')]),
    "text then two": (
        "Sure.\n\n" + CALL + "\n" + CALL.replace('"f"', '"g"'),
        "Sure.",
        [
            ("f", '{"s": "a}\\"<tool_call>", "n": [1, {"k": 2}]}'),
            ("g", '{"s": "a}\\"<tool_call>", "n": [1, {"k": 2}]}'),
        ],
    ),
    "cut short": (
        '<tool_call>\n{"name": "f", "arguments": {"s": "ab',
        '<tool_call>\n{"name": "f", "arguments": {"s": "ab',
        [],
    ),
}


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_parse_whole_answers(case):
    text, content, calls = ANSWERS[case]
    parsed = HERMES.parse(text)
    assert parsed.content == content
    assert [(c.name, c.arguments) for c in parsed.calls] == calls
    for call in parsed.calls:
        json.loads(call.arguments)


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_streamed_pieces_assemble_into_the_whole_parse(case):
    text, content, calls = ANSWERS[case]
    for size in (1, 2, 3, 7, len(text)):
        parser, events = HERMES.parser(), []
        for i in range(0, len(text), size):
            events += parser.feed(text[i : i + size])
        events += parser.finish()
        streamed = "".join(e.content or "" for e in events)
        if case == "cut short":  # deltas already sent stay sent: the call streams, then breaks off
            assert parser.broken and [e.name for e in events if e.name] == ["f"]
        elif calls:
            assert streamed == content or (content is None and streamed == "")
            names = [e.name for e in events if e.name is not None]
            args = {}
            for e in events:
                if e.arguments:
                    args[e.index] = args.get(e.index, "") + e.arguments
            assert list(zip(names, [args[i] for i in sorted(args)])) == calls
        else:
            assert streamed == text


def test_the_plan_grammar_takes_the_calls_and_refuses_the_rest():
    backend = ToyBackend(ToyModel(vocab_size=90))
    tools = parse_tools(
        [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
                },
            }
        ]
    )

    class Tok(type(backend.tokenizer)):
        chat_template = "{{ tools }} <tool_call>"

    tok = Tok(90)
    encode = tok.encode
    good = '<tool_call>\n{"name": "f", "arguments": {"n": 12}}\n</tool_call>'
    for mode, text, valid in [
        ("required", good, True),
        ("required", "hi" + good, False),
        ("auto", "hi" + good, True),
        ("auto", good.replace('"f"', '"g"'), False),
        ("auto", good.replace("12", '"x"'), False),
        ("none", good, False),
    ]:
        grammar = compile_constraint(tool_plan(tok, tools, ToolChoice(mode)).constraint, backend)
        ids = encode(text)
        assert (grammar.valid_prefix(ids) == len(ids)) == valid, (mode, text)
    one = compile_constraint(tool_plan(tok, tools, ToolChoice("auto"), parallel=False).constraint, backend)
    assert one.valid_prefix(encode(good + "\n" + good)) == len(encode(good))


def test_format_detection():
    assert format_for("{% for t in tools %}<tool_call>{% endfor %}").name == "hermes"
    assert format_for("{{ messages }}") is None and format_for(None) is None


def test_tool_checks_name_the_field():
    with pytest.raises(ToolSpecError) as info:
        parse_tools([{"type": "function", "function": {"name": "bad name"}}])
    assert info.value.param == "tools[0].function.name"
    tools = parse_tools([{"type": "function", "function": {"name": "f"}}])
    assert parse_tool_choice(None, tools) == ToolChoice("auto")
    assert parse_tool_choice({"type": "function", "function": {"name": "f"}}, tools) == ToolChoice("named", "f")
    with pytest.raises(ToolSpecError):
        parse_tool_choice({"type": "function", "function": {"name": "g"}}, tools)


def test_template_messages_parse_arguments_and_check_tool_messages():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"n": 1}'}}
    out = template_messages(
        [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "2"},
        ]
    )
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"n": 1}
    with pytest.raises(ToolSpecError) as info:
        template_messages([{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "2"}])
    assert info.value.param == "messages[1].tool_call_id"
