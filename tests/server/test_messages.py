"""Anthropic's Messages API through real HTTP with Anthropic's own client (anthropic-python):
messages.create and messages.stream, greedy answers equal to /v1/chat/completions' token for
token, tool_use answers and tool_result turns (valid against their schemas with speculation on
and off), stop reasons, count_tokens, x-api-key, tenant isolation, and errors in Anthropic's shape.

The server runs test_tools' scripted toy (a Hermes chat template; the model writes a call when
the user says "call", answers a tool result, else says "Hello there.").

NOTE: the anthropic client no longer takes temperature as an argument (newer Claude models have
no sampling parameters); draftwise takes it, so tests send it in extra_body.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from draftwise.server import create_app
from tests.server.conftest import API_KEY, MODEL, LiveServer
from tests.server.conftest import make_engine as plain_engine
from tests.server.test_server import client
from tests.server.test_tools import CALL, TOOLS
from tests.server.test_tools import make_engine as tools_engine

GREEDY = {"temperature": 0}
HELLO = [{"role": "user", "content": "hello"}]
# test_tools' OpenAI function tools as Anthropic's tools
CLAUDE_TOOLS = [
    {
        "name": f["name"],
        "description": f["description"],
        "input_schema": f["parameters"],
        "strict": f.get("strict", False),
    }
    for f in (t["function"] for t in TOOLS)
]
SCHEMAS = {t["name"]: t["input_schema"] for t in CLAUDE_TOOLS}


@pytest.fixture(scope="module")
def live():
    with LiveServer(tools_engine()) as server:
        yield server


@pytest.fixture(scope="module")
def claude(live) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=30)


def create(claude: anthropic.Anthropic, messages=HELLO, max_tokens: int = 200, extra: dict | None = None, **kwargs):
    return claude.messages.create(
        model=MODEL, max_tokens=max_tokens, messages=messages, extra_body={**GREEDY, **(extra or {})}, **kwargs
    )


def sse(response: httpx.Response) -> list[tuple[str, dict]]:
    """(event name, data) of each server-sent event."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in response.text.strip().split("\n\n"):
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


# ---------------------------------------------------------------------- text
def test_create_greedy_equals_chat_completions_token_for_token(live, claude):
    message = create(claude, max_tokens=60)
    v1 = client(live.url).chat.completions.create(
        model=MODEL, messages=HELLO, temperature=0, max_tokens=60, logprobs=True
    )
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == v1.choices[0].message.content == "Hello there."
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.role == "assistant" and message.type == "message" and message.model == MODEL
    assert message.id.startswith("msg_")
    usage = message.usage
    assert usage.output_tokens == v1.usage.completion_tokens == len(v1.choices[0].logprobs.content)
    assert usage.input_tokens + usage.cache_read_input_tokens == v1.usage.prompt_tokens
    speculative = usage.model_extra["speculative"]
    assert speculative["num_generated"] == usage.output_tokens and speculative["num_accepted"] > 0


def test_system_as_string_and_as_blocks_is_chat_completions_system(live, claude):
    v1 = client(live.url).chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "be brief"}, *HELLO], temperature=0
    )
    as_text = create(claude, system="be brief")
    as_blocks = create(claude, system=[{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}])
    tokens = claude.messages.count_tokens(model=MODEL, messages=HELLO, system="be brief").input_tokens
    assert as_text.content[0].text == as_blocks.content[0].text == v1.choices[0].message.content
    assert tokens == v1.usage.prompt_tokens
    assert tokens > claude.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens


def test_a_system_message_mid_conversation_is_a_system_message_where_it_stands(live, claude):
    """Claude Code sends one after the first user turn (the mid-conversation-system beta)."""
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        {"role": "system", "content": "be brief"},
    ]
    chat_turns = [{"role": "user", "content": "hello"}, {"role": "system", "content": "be brief"}]
    v1 = client(live.url).chat.completions.create(model=MODEL, messages=chat_turns, temperature=0, max_tokens=20)
    message = create(claude, messages=turns, max_tokens=20)
    assert message.content[0].text == v1.choices[0].message.content
    tokens = claude.messages.count_tokens(model=MODEL, messages=turns).input_tokens
    assert tokens == v1.usage.prompt_tokens
    with pytest.raises(anthropic.BadRequestError, match="messages.1.content.0"):
        create(claude, messages=[HELLO[0], {"role": "system", "content": [{"type": "image", "source": {}}]}])


def test_stream_text_events(claude):
    with claude.messages.stream(model=MODEL, max_tokens=60, messages=HELLO, extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop"
    deltas = [e.delta.text for e in events if e.type == "content_block_delta"]
    assert len(deltas) > 1 and "".join(deltas) == "Hello there."
    assert [b.text for b in final.content] == ["Hello there."] and final.stop_reason == "end_turn"
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.usage.output_tokens == final.usage.output_tokens == len("Hello there.")
    assert delta.usage.model_extra["speculative"]["num_generated"] == final.usage.output_tokens


def test_max_tokens_and_stop_sequences(claude):
    cut = create(claude, max_tokens=5)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 5 and cut.content[0].text == "Hello"
    stopped = create(claude, stop_sequences=["zzz", " th"])
    assert stopped.content[0].text == "Hello"
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == " th"


# ---------------------------------------------------------------------- tools
@pytest.mark.parametrize("speculate", [True, False])
def test_tool_use_answer_is_valid_and_equals_chat_completions(live, claude, speculate):
    call = [{"role": "user", "content": "call"}]
    message = create(claude, call, tools=CLAUDE_TOOLS, extra={"speculation": {"enabled": speculate}})
    assert message.stop_reason == "tool_use"
    text, use = message.content
    assert text.type == "text" and text.text == "Let me look."
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
    jsonschema.validate(use.input, SCHEMAS[use.name])
    assert CALL not in text.text
    speculative = message.usage.model_extra["speculative"]
    assert (speculative["num_drafted"] > 0) is speculate
    v1 = client(live.url).chat.completions.create(model=MODEL, messages=call, tools=TOOLS, temperature=0)
    assert json.loads(v1.choices[0].message.tool_calls[0].function.arguments) == use.input
    assert v1.usage.completion_tokens == message.usage.output_tokens


def test_streamed_tool_use_blocks(claude):
    with claude.messages.stream(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": "two"}],
        tools=CLAUDE_TOOLS,
        extra_body=GREEDY,
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [b.type for b in starts] == ["tool_use", "tool_use"] and [b.name for b in starts] == [
        "get_weather",
        "get_time",
    ]
    partial = [e.delta.partial_json for e in events if e.type == "content_block_delta"]
    assert partial and all(e.delta.type == "input_json_delta" for e in events if e.type == "content_block_delta")
    assert [b.input for b in final.content] == [{"city": "Paris"}, {"zone": "CET"}]
    for block in final.content:
        jsonschema.validate(block.input, SCHEMAS[block.name])
    assert final.stop_reason == "tool_use"
    indices = [e.index for e in events if e.type == "content_block_stop"]
    assert indices == [0, 1]


def test_a_call_cut_short_is_text_streamed_or_not(claude):
    kwargs = {"model": MODEL, "max_tokens": 30, "messages": [{"role": "user", "content": "call"}]}
    whole = claude.messages.create(**kwargs, tools=CLAUDE_TOOLS, extra_body=GREEDY)
    with claude.messages.stream(**kwargs, tools=CLAUDE_TOOLS, extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    assert whole.stop_reason == streamed.stop_reason == "max_tokens"
    assert [b.type for b in whole.content] == [b.type for b in streamed.content] == ["text"]
    assert whole.content[0].text == streamed.content[0].text == 'Let me look.\n<tool_call>\n{"nam'


def test_tool_result_turn(claude):
    call = [{"role": "user", "content": "call"}]
    first = create(claude, call, tools=CLAUDE_TOOLS)
    use = next(b for b in first.content if b.type == "tool_use")
    history = [
        *call,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "11 degrees celsius"}]},
    ]
    reply = create(claude, history, tools=CLAUDE_TOOLS)
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text == "It is sunny in Paris."
    assert reply.stop_reason == "end_turn"
    as_blocks = [
        {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "11 degrees celsius"}]}
    ]
    again = create(claude, [*history[:2], {"role": "user", "content": as_blocks}], tools=CLAUDE_TOOLS)
    assert again.content[0].text == "It is sunny in Paris."


def test_tool_choice_any_and_none(claude):
    forced = create(claude, tools=CLAUDE_TOOLS, tool_choice={"type": "any"})
    assert forced.stop_reason == "tool_use" and forced.content[-1].type == "tool_use"
    jsonschema.validate(forced.content[-1].input, SCHEMAS[forced.content[-1].name])
    named = create(claude, tools=CLAUDE_TOOLS, tool_choice={"type": "tool", "name": "get_time"})
    assert [b.name for b in named.content if b.type == "tool_use"] == ["get_time"]
    free = create(claude, [{"role": "user", "content": "call"}], tools=CLAUDE_TOOLS, tool_choice={"type": "none"})
    assert all(b.type == "text" for b in free.content) and free.stop_reason == "end_turn"


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]},
            "image",
        ),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
        ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": CLAUDE_TOOLS}, "tool_choice.name"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
    ],
)
def test_bad_requests_raise_bad_request_error(claude, kwargs, named):
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(**{"model": MODEL, "max_tokens": 10, "messages": HELLO, **kwargs})
    assert caught.value.status_code == 400 and named in caught.value.message
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "invalid_request_error"


def test_missing_max_tokens_unknown_model_and_error_shape(live, claude):
    response = httpx.post(f"{live.url}/v1/messages", json={"model": MODEL, "messages": HELLO}, timeout=30)
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=HELLO)
    assert caught.value.body["error"]["type"] == "not_found_error" and MODEL in caught.value.message
    adaptive = create(claude, max_tokens=5, thinking={"type": "adaptive"})  # the model decides, and it does not think
    assert adaptive.content[0].text == "Hello"


def test_structured_output_follows_the_schema(claude):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    message = create(claude, extra={"output_config": {"format": {"type": "json_schema", "schema": schema}}})
    jsonschema.validate(json.loads(message.content[0].text), schema)


# ---------------------------------------------------------------------- keys and tenants
def test_api_key_as_x_api_key_or_bearer():
    with LiveServer(plain_engine(), api_key=API_KEY) as server:
        with pytest.raises(anthropic.AuthenticationError) as caught:
            anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
                model=MODEL, max_tokens=3, messages=HELLO
            )
        assert caught.value.status_code == 401 and caught.value.body["error"]["type"] == "authentication_error"
        keyed = anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)  # sends x-api-key
        # greedy: a sampled answer of the toy model may end (EOS) before max_tokens
        assert create(keyed, max_tokens=3).usage.output_tokens == 3
        bearer = anthropic.Anthropic(base_url=server.url, auth_token=API_KEY, max_retries=0)  # Claude Code's AUTH_TOKEN
        assert bearer.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens > 0


def test_one_tenant_is_not_told_what_another_left_in_the_cache():
    engine = plain_engine()
    with LiveServer(engine, app=create_app(engine, MODEL, api_keys=("key-a", "key-b"))) as server:
        messages = [{"role": "user", "content": "a shared prompt both tenants send"}]

        def ask(key: str):
            one = anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0)
            return one.messages.create(model=MODEL, max_tokens=4, messages=messages).usage

        first, other, again = ask("key-a"), ask("key-b"), ask("key-b")
    assert first.cache_read_input_tokens == 0
    # b's first request found a's prompt in the cache: the usage does not say so
    assert other.cache_read_input_tokens == 0 and other.input_tokens == first.input_tokens
    assert other.model_extra["speculative"]["prefill_ms"] is None
    # b's own cache is b's to know
    assert again.cache_read_input_tokens > 0
    assert again.input_tokens + again.cache_read_input_tokens == first.input_tokens


def test_a_body_over_the_cap_is_request_too_large(live):
    response = httpx.post(
        f"{live.url}/v1/messages", content=b" " * (17 * 1024 * 1024), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413 and response.json()["error"]["type"] == "request_too_large"


def test_raw_stream_events_are_anthropics(live):
    body = {"model": MODEL, "max_tokens": 60, "messages": HELLO, "stream": True, "temperature": 0}
    events = sse(httpx.post(f"{live.url}/v1/messages", json=body, timeout=30))
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert events[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
