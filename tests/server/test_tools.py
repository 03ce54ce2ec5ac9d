"""Tool calling through the server with the openai client: a toy target that follows a script
(it writes a call in the Hermes format, or answers the tool's result), under a chat template in
that format. tool_choice auto / required / named / none, parallel_tool_calls, streamed deltas
assembled into the same calls, a follow-up turn with a tool message, and bad input as 400s.
"""

from __future__ import annotations

import json

import jinja2
import jsonschema
import openai
import pytest

from draftwise.backends.toy import CharTokenizer, ToyBackend, ToyModel
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.engine import Engine
from draftwise.types import SpeculationConfig
from tests.server.conftest import MODEL, LiveServer
from tests.server.test_server import client

VOCAB = 90
TEMPLATE = (
    "{% if tools %}tools:{% for t in tools %}{{ t.function.name }};{% endfor %}\n"
    'call as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>\n{% endif %}'
    "{% for m in messages %}{{ m.role[0] }}:{{ m.content or '' }}"
    '{% for c in m.tool_calls or [] %}<tool_call>\n{"name": "{{ c.function.name }}", "arguments": '
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}\n{% endfor %}"
    "{% if add_generation_prompt %}A>{% endif %}"
)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SCRIPTS = {
    "call": "Let me look.\n" + CALL,
    "answer": "It is sunny in Paris.",
    "two": CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
    # a call written as a JSON object (as Qwen2.5-Coder writes them in ```json blocks; the toy has no `)
    "block": 'Sure: {"name": "get_weather", "arguments": {"city": "Paris"}}',
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 8}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a zone.",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "maxLength": 5}},
                "required": ["zone"],
            },
        },
    },
]


class HermesToyTokenizer(CharTokenizer):
    chat_template = TEMPLATE

    def apply_chat_template(self, messages, *, add_generation_prompt=True, tools=None):
        env = jinja2.Environment()
        env.filters["tojson"] = lambda x: json.dumps(x)
        return env.from_string(TEMPLATE).render(
            messages=messages, tools=tools, add_generation_prompt=add_generation_prompt
        )


TOKENS = HermesToyTokenizer(VOCAB)
NOISE = ToyModel(vocab_size=VOCAB, sharpness=1.0)


def scripted(context):
    """Logits that follow a script: the answer to a tool result, else the script the last user
    message names; small noise elsewhere (so a grammar that forbids the script's token picks one)."""
    text = TOKENS.decode(context)
    if "A>" not in text:  # a prompt position (the toy computes rows it is not asked for)
        return NOISE.logits(context)
    prompt, generated = text.rsplit("A>", 1)
    last = prompt.rstrip("\n").rsplit("\n", 1)[-1]
    script = SCRIPTS["answer"] if last.startswith("t:") else SCRIPTS.get(last[2:].strip(), "Hello there.")
    row = NOISE.logits(context).copy()
    n = len(generated)
    want = TOKENS.encode(script[n])[0] if n < len(script) and script.startswith(generated) else 0
    row[want] += 20.0
    return row


def make_engine() -> Engine:
    target = ToyBackend(logits_fn=scripted, vocab_size=VOCAB, tokenizer=TOKENS, name="toy-tools")
    draft = ToyBackend(logits_fn=scripted, vocab_size=VOCAB, tokenizer=HermesToyTokenizer(VOCAB), name="toy-draft")
    return Engine(
        target,
        [ModelDrafter(draft, name="draft"), NgramDrafter(2, 4), GrammarDrafter()],
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4),
    )


@pytest.fixture(scope="module")
def tool_server():
    with LiveServer(make_engine()) as live:
        yield live


def ask(live, script: str, stream: bool = False, **kwargs):
    messages = kwargs.pop("messages", [{"role": "user", "content": script}])
    return client(live.url).chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, temperature=0, max_tokens=200, stream=stream, **kwargs
    )


def assembled(chunks) -> tuple[str, list[dict], str | None]:
    """Streamed deltas put together: content, calls (id, name, arguments), finish_reason."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                if call.id:
                    assert slot["id"] is None and not slot["arguments"], "id and name come first, once"
                    slot["id"], slot["name"] = call.id, call.function.name
                slot["arguments"] += (call.function.arguments or "") if call.function else ""
            finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("speculate", [False, True])
def test_auto_call_with_content(tool_server, speculate):
    reply = ask(tool_server, "call", extra_body={"speculation": {"enabled": speculate}})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look."
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert reply.usage.completion_tokens > 0


def test_auto_streamed_deltas_assemble_into_the_same_call(tool_server):
    whole = ask(tool_server, "call").choices[0].message
    content, calls, finish = assembled(ask(tool_server, "call", stream=True))
    assert finish == "tool_calls" and content == whole.content
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in whole.tool_calls
    ]


@pytest.mark.parametrize("speculate", [False, True])
def test_auto_reads_a_call_written_as_a_json_object(tool_server, speculate):
    reply = ask(tool_server, "block", extra_body={"speculation": {"enabled": speculate}}).choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.content == "Sure:"
    [call] = reply.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    content, calls, finish = assembled(ask(tool_server, "block", stream=True))
    assert (content, [(c["name"], c["arguments"]) for c in calls], finish) == (
        "Sure:",
        [(call.function.name, call.function.arguments)],
        "tool_calls",
    )
    none = ask(tool_server, "block", tool_choice="none").choices[0]  # not a call: text, as written
    assert not none.message.tool_calls and none.message.content == SCRIPTS["block"]


def test_parallel_calls_and_parallel_false(tool_server):
    calls = ask(tool_server, "two").choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert len({c.id for c in calls}) == 2
    one = ask(tool_server, "two", parallel_tool_calls=False).choices[0]
    assert [c.function.name for c in one.message.tool_calls] == ["get_weather"]
    assert one.finish_reason == "tool_calls"


def test_text_answer_under_auto_and_none(tool_server):
    for choice in ("auto", "none"):
        reply = ask(tool_server, "nothing", tool_choice=choice).choices[0]
        assert reply.message.content == "Hello there." and not reply.message.tool_calls
        assert reply.finish_reason == "stop"
    none = ask(tool_server, "call", tool_choice="none").choices[0]  # the script's call is forbidden
    assert not none.message.tool_calls and "<tool_call>" not in none.message.content


@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_calls_validate(tool_server, stream):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        reply = ask(tool_server, "nothing", stream=stream, tool_choice=choice, parallel_tool_calls=False)
        if stream:
            content, calls, finish = assembled(reply)
        else:
            message, finish = reply.choices[0].message, reply.choices[0].finish_reason
            content = message.content
            calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls]
        assert finish == "tool_calls" and not content and calls
        for call in calls:
            jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])
        assert len(calls) == 1
        if isinstance(choice, dict):
            assert [c["name"] for c in calls] == ["get_time"]


def test_follow_up_turn_with_a_tool_message(tool_server):
    first = ask(tool_server, "call").choices[0].message
    messages = [
        {"role": "user", "content": "call"},
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "sunny, 24 C"},
    ]
    reply = ask(tool_server, "", messages=messages).choices[0]
    assert reply.message.content == "It is sunny in Paris." and reply.finish_reason == "stop"


@pytest.mark.parametrize(
    "tools, extra, param",
    [
        ([{"type": "function", "function": {"description": "no name"}}], {}, "tools[0].function.name"),
        ([TOOLS[0], TOOLS[0]], {}, "tools[1].function.name"),
        (TOOLS, {"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
        (TOOLS, {"tool_choice": "sometimes"}, "tool_choice"),
        (
            [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "strict": True,
                        "parameters": {
                            "type": "object",
                            "properties": {"x": {"type": "string", "format": "no-such-format"}},
                        },
                    },
                }
            ],
            {},
            "tools",
        ),
    ],
)
def test_bad_tools_are_400s_naming_the_field(tool_server, tools, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        client(tool_server.url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], tools=tools, **extra
        )
    assert info.value.body["param"] == param, info.value.body


def test_a_tool_message_without_its_call_is_a_400(tool_server):
    with pytest.raises(openai.BadRequestError) as info:
        ask(
            tool_server,
            "",
            messages=[{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_x", "content": "y"}],
        )
    assert info.value.body["param"] == "messages[1].tool_call_id"


def test_a_vocabulary_that_cannot_write_a_call_is_a_400(server):
    """The toy of the `server` fixture has no template format, so its calls are plain JSON
    (test_tool_formats.py), which its 40 characters cannot spell (no braces, no quotes)."""
    with pytest.raises(openai.BadRequestError) as info:
        client(server.url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], tools=TOOLS, tool_choice="required"
        )
    assert info.value.body["param"] == "tools" and "constraint" in info.value.body["message"]


def test_langchain_bind_tools_and_structured_output(tool_server):
    """LangChain's ChatOpenAI against the server: bind_tools reads the call, and
    with_structured_output(method="function_calling") (a named tool_choice) returns the model."""
    langchain_openai = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        """The weather in a city."""

        city: str = Field(max_length=8)

    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    llm = langchain_openai.ChatOpenAI(
        model=MODEL, base_url=f"{tool_server.url}/v1", api_key="unused", temperature=0, max_retries=0, timeout=30
    )
    message = llm.bind_tools([get_weather]).invoke("call")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert message.content == "Let me look."
    record = llm.with_structured_output(Weather, method="function_calling").invoke("nothing")
    assert isinstance(record, Weather) and len(record.city) <= 8
