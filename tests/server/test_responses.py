"""OpenAI's Responses API through real HTTP with the openai client and the OpenAI Agents SDK's
default model (OpenAIResponsesModel): text streamed and not, greedy answers equal to
/v1/chat/completions' token for token, function tools and their results (as input items and
through previous_response_id), text.format with a schema, stored responses (retrieve, delete,
per API key), and refusals as 400s.

The server runs test_tools' scripted toy (a Hermes chat template; the model writes a call when
the user says "call", answers a tool result, else says "Hello there."); the agent loop runs
test_agent_loop's two-tool script.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from draftwise.server import create_app
from draftwise.server.responses_protocol import ResponseStore, Stored
from tests.server.conftest import MODEL, LiveServer
from tests.server.test_agent_loop import agent_server  # noqa: F401 (the two-tool agent's server)
from tests.server.test_server import client
from tests.server.test_tools import TOOLS
from tests.server.test_tools import make_engine as tools_engine

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
# test_tools' tools in the Responses API's flat shape
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
GREEDY = {"temperature": 0, "max_output_tokens": 200}
STREAM_EVENT = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def live():
    with LiveServer(tools_engine()) as server:
        yield server


@pytest.fixture(scope="module")
def oa(live) -> openai.OpenAI:
    return client(live.url)


def events(stream) -> list:
    """The stream's events, each checked against the openai client's types (the client itself
    reads them leniently) and numbered in order."""
    out = list(stream)
    for event in out:
        STREAM_EVENT.validate_python(event.to_dict())
    assert [e.sequence_number for e in out] == list(range(len(out)))
    return out


# ---------------------------------------------------------------------- text
def test_text_equals_chat_completions_token_for_token(oa):
    response = oa.responses.create(model=MODEL, input="hello", instructions="be brief", **GREEDY)
    Response.model_validate(response.to_dict())  # every field the client's type requires
    chat = oa.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
        temperature=0,
        max_tokens=200,
    )
    assert response.output_text == chat.choices[0].message.content == "Hello there."
    assert response.status == "completed" and response.id.startswith("resp_")
    [item] = response.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    usage = response.usage
    assert usage.input_tokens == chat.usage.prompt_tokens and usage.output_tokens == chat.usage.completion_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    speculative = usage.model_extra["speculative"]
    assert speculative["num_generated"] == usage.output_tokens and speculative["num_accepted"] > 0


def test_max_output_tokens_makes_an_incomplete_response(oa):
    response = oa.responses.create(model=MODEL, input="hello", temperature=0, max_output_tokens=5)
    assert response.output_text == "Hello" and response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens" and response.usage.output_tokens == 5


def test_stream_sends_the_event_sequence(oa):
    got = events(oa.responses.create(model=MODEL, input="hello", stream=True, **GREEDY))
    kinds = [e.type for e in got]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-5:] == [
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in got if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "Hello there." and len(deltas) > 1
    final = got[-1].response
    assert final.output_text == "Hello there." and final.usage.output_tokens == len("Hello there.")
    item_ids = {e.item_id for e in got if hasattr(e, "item_id")}
    assert item_ids == {final.output[0].id}


def test_stream_helper_of_the_client_assembles_the_response(oa):
    with oa.responses.stream(model=MODEL, input="hello", **GREEDY) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == final.output_text == "Hello there."


def test_stream_cut_by_max_output_tokens_ends_incomplete(oa):
    got = events(oa.responses.create(model=MODEL, input="hello", temperature=0, max_output_tokens=5, stream=True))
    assert got[-1].type == "response.incomplete"
    final = got[-1].response
    assert final.status == "incomplete" and final.output_text == "Hello" and final.output[0].status == "incomplete"


def test_input_items_equal_the_chat_messages_they_mean(oa):
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello there."}]},
        {"role": "user", "content": "hello"},
    ]
    response = oa.responses.create(model=MODEL, input=items, **GREEDY)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello there."},
        {"role": "user", "content": "hello"},
    ]
    chat = oa.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=200)
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens


# ---------------------------------------------------------------------- tools
@pytest.mark.parametrize("speculate", [False, True])
def test_function_call_is_valid_against_its_schema(oa, speculate):
    response = oa.responses.create(
        model=MODEL, input="call", tools=FLAT_TOOLS, extra_body={"speculation": {"enabled": speculate}}, **GREEDY
    )
    message, call = response.output
    assert message.type == "message" and message.content[0].text == "Let me look."
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, TOOLS[0]["function"]["parameters"])
    assert arguments == {"city": "Paris"}
    chat = client_chat(oa, "call")
    assert chat.choices[0].message.tool_calls[0].function.arguments == call.arguments


def client_chat(oa, text: str):
    return oa.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], tools=TOOLS, temperature=0, max_tokens=200
    )


def test_streamed_function_call_matches_the_whole_one(oa):
    whole = oa.responses.create(model=MODEL, input="call", tools=FLAT_TOOLS, **GREEDY)
    got = events(oa.responses.create(model=MODEL, input="call", tools=FLAT_TOOLS, stream=True, **GREEDY))
    final = got[-1].response
    assert [i.type for i in final.output] == ["message", "function_call"]
    call = final.output[1]
    deltas = "".join(e.delta for e in got if e.type == "response.function_call_arguments.delta")
    [done] = [e for e in got if e.type == "response.function_call_arguments.done"]
    assert deltas == done.arguments == call.arguments == whole.output[1].arguments
    added = [e.item for e in got if e.type == "response.output_item.added"]
    assert [i.type for i in added] == ["message", "function_call"] and added[1].call_id == call.call_id


def test_named_tool_choice_and_one_call(oa):
    response = oa.responses.create(
        model=MODEL,
        input="two",
        tools=FLAT_TOOLS,
        tool_choice={"type": "function", "name": "get_time"},
        parallel_tool_calls=False,
        **GREEDY,
    )
    [call] = [i for i in response.output if i.type == "function_call"]
    assert call.name == "get_time"
    jsonschema.validate(json.loads(call.arguments), TOOLS[1]["function"]["parameters"])
    assert response.tool_choice.name == "get_time" and response.parallel_tool_calls is False


def test_a_codex_shaped_turn_streams_to_completion(live):
    """The fields Codex CLI sends (codex-rs ResponsesApiRequest): instructions, a developer message,
    function tools with strict false, tool_choice auto, store false, include, prompt_cache_key."""
    body = {
        "model": MODEL,
        "instructions": "You are a coding agent.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: none"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "call"}]},
        ],
        "tools": [{**FLAT_TOOLS[0], "strict": False}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": None,
        "store": False,
        "stream": True,
        "include": [],
        "prompt_cache_key": "0199-session",
        "temperature": 0,
    }
    headers = {"Authorization": "Bearer unused", "Accept": "text/event-stream"}
    reply = httpx.post(f"{live.url}/v1/responses", json=body, headers=headers, timeout=30)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in reply.text.split("\n\n") if b]
    kinds = [b.split("\n")[0].removeprefix("event: ") for b in blocks]
    datas = [json.loads(b.split("\n")[1].removeprefix("data: ")) for b in blocks]
    assert kinds == [d["type"] for d in datas] and kinds[-1] == "response.completed"
    done = [d["item"] for d in datas if d["type"] == "response.output_item.done"]
    assert [i["type"] for i in done] == ["message", "function_call"]
    assert json.loads(done[1]["arguments"]) == {"city": "Paris"}
    final = datas[-1]["response"]
    assert final["usage"]["output_tokens"] > 0 and final["store"] is False


def test_tool_result_as_input_items(oa):
    first = oa.responses.create(model=MODEL, input="call", tools=FLAT_TOOLS, **GREEDY)
    call = first.output[1]
    items = [
        {"role": "user", "content": "call"},
        *[i.model_dump(exclude_none=True) for i in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    second = oa.responses.create(model=MODEL, input=items, tools=FLAT_TOOLS, store=False, **GREEDY)
    assert second.output_text == "It is sunny in Paris."
    with pytest.raises(openai.NotFoundError):  # store: false keeps nothing
        oa.responses.retrieve(second.id)


def test_tool_result_through_previous_response_id_reuses_the_cache(oa):
    first = oa.responses.create(model=MODEL, input="call", tools=FLAT_TOOLS, **GREEDY)
    call = first.output[1]
    second = oa.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=FLAT_TOOLS,
        **GREEDY,
    )
    assert second.output_text == "It is sunny in Paris." and second.previous_response_id == first.id
    # the follow-up's prompt is the first turn's up to its generation prompt "A>" (two characters of
    # the toy's tokenizer, where the template then lays out the answer): the cache held all of that
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - len("A>")


# ---------------------------------------------------------------------- text.format
def test_text_format_json_schema_follows_the_schema(oa):
    response = oa.responses.create(
        model=MODEL,
        input="hello",
        text={"format": {"type": "json_schema", "name": "thing", "schema": SCHEMA, "strict": True}},
        **GREEDY,
    )
    jsonschema.validate(json.loads(response.output_text), SCHEMA)
    chat = oa.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}},
        temperature=0,
        max_tokens=200,
    )
    assert response.output_text == chat.choices[0].message.content
    assert response.text.format.type == "json_schema"
    # any JSON object: the noisy toy writes a long one, cut at max_output_tokens as chat's is
    loose = oa.responses.create(model=MODEL, input="hello", text={"format": {"type": "json_object"}}, **GREEDY)
    chat_loose = oa.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=200,
    )
    assert loose.output_text == chat_loose.choices[0].message.content and loose.output_text.startswith("{")


# ---------------------------------------------------------------------- stored responses
def test_retrieve_and_delete(oa):
    response = oa.responses.create(model=MODEL, input="hello", metadata={"k": "v"}, **GREEDY)
    again = oa.responses.retrieve(response.id)
    assert again.id == response.id and again.output_text == "Hello there." and again.metadata == {"k": "v"}
    oa.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        oa.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        oa.responses.create(model=MODEL, input="hello", previous_response_id=response.id, **GREEDY)


def test_another_api_key_cannot_read_a_stored_response():
    engine = tools_engine()
    app = create_app(engine, MODEL, api_keys=["sk-a", "sk-b"])
    with LiveServer(engine, app=app) as server:
        a, b = client(server.url, api_key="sk-a"), client(server.url, api_key="sk-b")
        response = a.responses.create(model=MODEL, input="hello", **GREEDY)
        assert a.responses.retrieve(response.id).id == response.id
        with pytest.raises(openai.NotFoundError):
            b.responses.retrieve(response.id)
        with pytest.raises(openai.NotFoundError):
            b.responses.create(model=MODEL, input="hi", previous_response_id=response.id, **GREEDY)
        with pytest.raises(openai.NotFoundError):
            b.responses.delete(response.id)
        assert a.responses.retrieve(response.id).id == response.id


def test_store_keeps_the_newest_per_key():
    store = ResponseStore(per_key=2)
    for i in range(3):
        store.put(1, Stored({"id": f"r{i}"}, ()))
    store.put(2, Stored({"id": "other"}, ()))
    assert store.get(1, "r0") is None and store.get(1, "r2") is not None and store.get(1, "r1") is not None
    assert store.get(1, "other") is None and store.get(2, "other") is not None


# ---------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
        ({"background": True}, "background"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"input": [{"type": "local_shell_call", "call_id": "c", "action": {}}]}, "input[0].type"),
        ({"text": {"format": {"type": "json_object"}}, "tools": FLAT_TOOLS}, "text.format"),
        ({"tools": FLAT_TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ],
)
def test_fields_that_cannot_be_served_are_400(oa, fields, param):
    request = {"model": MODEL, "input": "hello", **fields}
    with pytest.raises(openai.BadRequestError) as raised:
        oa.responses.create(**request)
    assert raised.value.body["param"] == param


def test_unknown_model_is_404(live):
    reply = httpx.post(f"{live.url}/v1/responses", json={"model": "nope", "input": "hi"}, timeout=30)
    assert reply.status_code == 404 and reply.json()["error"]["param"] == "model"


# ---------------------------------------------------------------------- the Agents SDK
@pytest.mark.parametrize("how", ["model", "default_client"])
def test_agents_sdk_responses_model_runs_two_tools(agent_server, how):  # noqa: F811
    """The SDK's Responses model given explicitly, or by name through the default client (the
    SDK's default API is the Responses API)."""
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(("get_weather", city))
        return "sunny" if city == "Paris" else "unknown"

    @agents.function_tool
    def get_time(zone: str) -> str:
        """The time in a zone."""
        calls.append(("get_time", zone))
        return "noon" if zone == "CET" else "unknown"

    async_client = AsyncOpenAI(base_url=f"{agent_server.url}/v1", api_key="unused", max_retries=0, timeout=30)
    if how == "model":
        model = agents.OpenAIResponsesModel(model=MODEL, openai_client=async_client)
    else:
        agents.set_default_openai_client(async_client, use_for_tracing=False)
        model = MODEL
    agent = agents.Agent(
        name="helper",
        instructions="Use the tools.",
        tools=[get_weather, get_time],
        model=model,
        model_settings=agents.ModelSettings(temperature=0, max_tokens=200),
    )
    try:
        result = agents.Runner.run_sync(agent, "Weather and time in Paris?", max_turns=5)
    finally:
        if how == "default_client":
            agents.set_default_openai_client(AsyncOpenAI(api_key="unused"), use_for_tracing=False)
    assert calls == [("get_weather", "Paris"), ("get_time", "CET")]
    assert result.final_output == "It is sunny at noon."
    items = [type(i).__name__ for i in result.new_items]
    assert items.count("ToolCallItem") == 2 and items.count("ToolCallOutputItem") == 2, items
    # three turns, each a /v1/responses response (chat completions' turns carry no response id)
    assert [r.response_id[:5] for r in result.raw_responses] == ["resp_"] * 3


def test_a_failure_mid_stream_is_an_error_event_then_response_failed():
    """The events of an answer that fails after its first text, read by the openai client's types."""
    from draftwise.server.responses_answers import ResponseAnswer
    from draftwise.server.responses_protocol import ResponsesRequest
    from draftwise.server.serving import Piece

    answer = ResponseAnswer(ResponsesRequest(model=MODEL, input="hi"), MODEL, None, None)
    chunks = [*answer.openings(), *answer.piece(Piece("Hel")), *answer.failed("generation failed: boom", None, None)]
    parsed = [STREAM_EVENT.validate_json(c.split("data: ", 1)[1]) for c in chunks]
    assert [e.type for e in parsed] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "error",
        "response.failed",
    ]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    assert parsed[-2].message == "generation failed: boom"
    assert parsed[-1].response.status == "failed" and parsed[-1].response.error.message == "generation failed: boom"
