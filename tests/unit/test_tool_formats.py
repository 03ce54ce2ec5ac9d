"""The tool-call formats besides Hermes (draftwise.tools.formats): Llama 3.x JSON, Mistral's
[TOOL_CALLS] list and plain JSON objects for a model whose template names none. Each format's
answers parsed whole and fed in every split, the plan's grammar on the toy vocabulary (the calls
it takes and the text it refuses), which format a template or a vocabulary gets, and the
messages of a model whose template lays out no tools."""

from __future__ import annotations

import json

import pytest

from draftwise.backends.toy import CharTokenizer, ToyBackend, ToyModel
from draftwise.constraints import compile_constraint
from draftwise.tools import ToolChoice, parse_tools, template_messages, tool_plan
from draftwise.tools.formats import PLAIN, choose_format, format_for

TOOLS = parse_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            },
        },
        {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {}}}},
    ]
)
LLAMA3 = "{{ tools }}<|start_header_id|>ipython<|end_header_id|>"
MISTRAL = "{{ tools }}[AVAILABLE_TOOLS][TOOL_CALLS]"
PLAIN_TEMPLATE = "{{ messages }}"  # no tools


def _tokenizer(template: str | None) -> CharTokenizer:
    class Tok(CharTokenizer):
        chat_template = template

    return Tok(90)


def _plan(template: str | None, mode: str = "auto", name: str | None = None, parallel: bool = True):
    return tool_plan(_tokenizer(template), TOOLS, ToolChoice(mode, name), parallel)


# (template, answer, content, calls)
ANSWERS = {
    "llama3 bare": (LLAMA3, '{"name": "f", "parameters": {"n": 1}}', None, [("f", '{"n": 1}')]),
    "llama3 tag": (LLAMA3, '<|python_tag|>{"name": "g", "parameters": {}}', None, [("g", "{}")]),
    "llama3 text": (LLAMA3, 'The {"name" key is f.', 'The {"name" key is f.', []),
    "mistral one": (MISTRAL, '[TOOL_CALLS][{"name": "f", "arguments": {"n": 2}}]', None, [("f", '{"n": 2}')]),
    "mistral two": (
        MISTRAL,
        'Sure. [TOOL_CALLS][{"name": "f", "arguments": {"n": [3]}}, {"name": "g", "arguments": {}}]',
        "Sure.",
        [("f", '{"n": [3]}'), ("g", "{}")],
    ),
    "mistral cut": (MISTRAL, '[TOOL_CALLS][{"name": "f", "arguments": {"n"', None, None),
    "plain bare": (PLAIN_TEMPLATE, 'ok {"name": "f", "arguments": {"n": 4}}', "ok", [("f", '{"n": 4}')]),
    "plain fenced": (
        PLAIN_TEMPLATE,
        '```json\n{\n  "name": "g",\n  "arguments": {}\n}\n```',
        None,
        [("g", "{}")],
    ),
    "plain other object": (PLAIN_TEMPLATE, '{"name": "h"}', '{"name": "h"}', []),
}


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_answers_parse_whole_and_in_pieces(case):
    template, text, content, calls = ANSWERS[case]
    plan = _plan(template)
    parsed = plan.parse(text)
    if calls is None:  # cut short: the whole text is content
        assert parsed.content == text and not parsed.calls
        return
    assert parsed.content == (content if calls else text)
    assert [(c.name, c.arguments) for c in parsed.calls] == calls
    for size in (1, 2, 5, len(text)):
        parser, events = plan.parser(), []
        for i in range(0, len(text), size):
            events += parser.feed(text[i : i + size])
        events += parser.finish()
        assert "".join(e.content or "" for e in events) == (content or "" if calls else text)
        names = [e.name for e in events if e.name is not None]
        arguments: dict[int, str] = {}
        for e in events:
            if e.arguments:
                arguments[e.index] = arguments.get(e.index, "") + e.arguments
        assert list(zip(names, [arguments.get(i, "") for i in range(len(names))])) == calls


GOOD = {
    "llama3": (LLAMA3, '{"name": "f", "parameters": {"n": 12}}'),
    "mistral": (MISTRAL, '[TOOL_CALLS][{"name": "f", "arguments": {"n": 12}}, {"name": "g", "arguments": {}}]'),
    "plain": (PLAIN_TEMPLATE, '{"name": "f", "arguments": {"n": 12}}'),
}


@pytest.mark.parametrize(
    "fmt, mode, text, valid",
    [
        ("llama3", "required", "{good}", True),
        ("llama3", "required", "hi {good}", False),
        ("llama3", "auto", "hi {good}", True),
        ("llama3", "auto", '{"name": "f", "arguments": {"n": 1}}', False),  # Llama's key is "parameters"
        ("llama3", "named", "{good}", True),
        ("mistral", "required", "{good}", True),
        ("mistral", "auto", "hi {good}", True),
        ("mistral", "named", "{good}", False),  # a named tool: one call, of that tool
        ("mistral", "named", '[TOOL_CALLS][{"name": "f", "arguments": {"n": 1}}]', True),
        ("mistral", "none", "{good}", False),
        ("plain", "required", "{good}", True),
        ("plain", "required", "hi {good}", False),
        ("plain", "auto", "hi {good}", True),
        ("plain", "auto", 'hi {"name": "f", "arguments": {"n": "x"}}', False),
        ("plain", "named", '{"name": "g", "arguments": {}}', False),
    ],
)
def test_the_plan_grammar_takes_the_calls_and_refuses_the_rest(fmt, mode, text, valid):
    template, good = GOOD[fmt]
    tok = _tokenizer(template)
    plan = tool_plan(tok, TOOLS, ToolChoice(mode, "f" if mode == "named" else None))
    grammar = compile_constraint(plan.constraint, ToyBackend(ToyModel(vocab_size=90), tokenizer=tok))
    ids = tok.encode(text.replace("{good}", good))
    assert (grammar.valid_prefix(ids) == len(ids)) == valid


def test_llama3_takes_one_call_and_plain_none_is_unconstrained():
    tok = _tokenizer(LLAMA3)
    plan = tool_plan(tok, TOOLS, ToolChoice("required"))
    grammar = compile_constraint(plan.constraint, ToyBackend(ToyModel(vocab_size=90), tokenizer=tok))
    one = tok.encode(GOOD["llama3"][1])
    assert grammar.valid_prefix(one + tok.encode(" {")) == len(one)
    assert _plan(PLAIN_TEMPLATE, "none").constraint is None
    assert not _plan(PLAIN_TEMPLATE, "none").parse(GOOD["plain"][1]).calls  # none: text only


@pytest.mark.parametrize(
    "template, tokens, expected",
    [
        (LLAMA3, set(), "llama3_json"),
        (MISTRAL, set(), "mistral"),
        ("{% for t in tools %}<tool_call>{% endfor %}", set(), "hermes"),
        (None, {"<|python_tag|>", "<|start_header_id|>"}, "llama3_json"),  # a built-in llama3 template
        (None, {"[TOOL_CALLS]"}, "mistral"),
        (None, {"<tool_call>", "</tool_call>"}, "hermes"),
        (PLAIN_TEMPLATE, {"<|start_header_id|>"}, "json"),  # Llama 3.0: no python tag
        (None, set(), "json"),
    ],
)
def test_the_format_by_template_then_vocabulary(template, tokens, expected):
    assert choose_format(template, tokens.__contains__).name == expected
    assert (format_for(template) is not None) == (expected != "json" and template is not None)


def test_a_template_without_tools_gets_them_in_a_system_message():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"n": 1}'}}
    history = template_messages(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "Let me see.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "2"},
        ]
    )
    plan = _plan(PLAIN_TEMPLATE, "auto")
    assert not plan.templated and plan.format is PLAIN
    messages = plan.messages(history)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    system = messages[0]["content"]
    assert system.startswith("Be brief.\n\nYou can call these tools")
    assert json.dumps(TOOLS[0].as_openai()["function"]) in system and '{"name": "<tool name>"' in system
    assert messages[2]["content"] == 'Let me see.\n{"name": "f", "arguments": {"n": 1}}'
    assert messages[3]["content"] == "f returned: 2" and "tool_calls" not in messages[2]
    named = _plan(PLAIN_TEMPLATE, "named", "g").messages(history[1:2])
    assert '"name": "f"' not in named[0]["content"] and "You must call a tool" in named[0]["content"]
    mistral = _plan(None, "auto")  # no template: plain JSON, described
    assert mistral.messages(history) != history
    assert _plan(MISTRAL).messages(history) == history  # the template lays the tools out itself
