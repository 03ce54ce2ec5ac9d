"""Ollama's API through real HTTP with Ollama's own clients (the `ollama` package, LangChain's
ChatOllama): chat and generate streamed and not, greedy answers equal to /v1's token for token,
options, format (JSON and a schema), tools and tool results, generate with a suffix (FIM), the
model routes, and errors as Ollama answers them (clients raise their ResponseError).

The chat server runs test_tools' scripted toy (a Hermes chat template; the model writes a call
when the user says "call", answers a tool result, else says "Hello there."); the FIM server
the tiny random GGUF holding Qwen2.5-Coder's FIM tokens that test_infill uses.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import pytest

from draftwise.backends.llamacpp import LlamaCppBackend
from draftwise.drafters import NgramDrafter
from draftwise.engine import Engine
from draftwise.models import DEFAULT_TARGET
from draftwise.server import create_app
from draftwise.types import SpeculationConfig
from tests.server.conftest import API_KEY, MODEL, LiveServer
from tests.server.conftest import make_engine as plain_engine
from tests.server.test_server import client
from tests.server.test_tools import CALL, TOOLS
from tests.server.test_tools import make_engine as tools_engine

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
GREEDY = {"temperature": 0, "num_predict": 60}
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def live():
    with LiveServer(tools_engine()) as server:
        yield server


@pytest.fixture(scope="module")
def ol(live) -> ollama.Client:
    return ollama.Client(host=live.url, timeout=30)


@pytest.fixture(scope="module")
def fim_live(tmp_path_factory):
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path_factory.mktemp("fim") / "fim.gguf", fim=True)
    target = LlamaCppBackend(path, n_ctx=2048, n_threads=1)
    engine = Engine(target, [NgramDrafter(1, 3)], speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4))
    with LiveServer(engine) as server:
        yield server
    target.close()


def lines(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines() if line]


# ---------------------------------------------------------------------- chat and generate
def test_chat_greedy_equals_v1_token_for_token(live, ol):
    answer = ol.chat(model=MODEL, messages=HELLO, options=GREEDY, stream=False, logprobs=True)
    v1 = client(live.url).chat.completions.create(
        model=MODEL, messages=HELLO, temperature=0, max_tokens=60, logprobs=True
    )
    assert answer.message.content == v1.choices[0].message.content == "Hello there."
    assert [e.token for e in answer.logprobs] == [e.token for e in v1.choices[0].logprobs.content]
    assert answer.eval_count == v1.usage.completion_tokens
    assert answer.prompt_eval_count == v1.usage.prompt_tokens
    assert answer.done and answer.done_reason == "stop"


def test_chat_streamed_pieces_make_the_whole_answer(ol):
    chunks = list(ol.chat(model=MODEL + ":latest", messages=HELLO, options=GREEDY, stream=True))
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(c.message.content for c in chunks) == "Hello there."
    last = chunks[-1]
    assert last.message.content == "" and last.done_reason == "stop" and last.model == MODEL + ":latest"
    assert last.eval_count == len("Hello there.") and last.prompt_eval_count > 0
    assert isinstance(last.total_duration, int) and last.total_duration >= last.eval_duration > 0
    assert last.load_duration == 0 and last.created_at.endswith("Z")


def test_final_object_carries_the_speculation_stats(live):
    body = {"model": MODEL, "messages": HELLO, "options": GREEDY}
    objects = lines(httpx.post(f"{live.url}/api/chat", json=body, timeout=30))
    final = objects[-1]
    assert final["done"] is True and all("speculative" not in o for o in objects[:-1])
    speculative = final["speculative"]
    assert speculative["num_generated"] == final["eval_count"]
    assert speculative["num_drafted"] > 0 and speculative["num_accepted"] > 0  # the draft follows the script
    assert speculative["num_steps"] < final["eval_count"]  # several tokens per target step
    whole = httpx.post(f"{live.url}/api/chat", json={**body, "stream": False}, timeout=30).json()
    assert whole["speculative"]["num_generated"] == whole["eval_count"]


def test_generate_uses_the_chat_template_and_raw_uses_the_prompt(live, ol):
    templated = ol.generate(model=MODEL, prompt="hello", system="be brief", options=GREEDY)
    v1_chat = client(live.url).chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "be brief"}, *HELLO],
        temperature=0,
        max_tokens=60,
    )
    assert templated.response == v1_chat.choices[0].message.content == "Hello there."
    raw = ol.generate(model=MODEL, prompt="u:hello\nA>", raw=True, options={"temperature": 0, "num_predict": 8})
    v1 = client(live.url).completions.create(model=MODEL, prompt="u:hello\nA>", temperature=0, max_tokens=8)
    assert raw.response == v1.choices[0].text == "Hello th"
    assert raw.done_reason == "length" and raw.eval_count == 8
    streamed = list(ol.generate(model=MODEL, prompt="u:hello\nA>", raw=True, options=GREEDY, stream=True))
    assert "".join(c.response for c in streamed) == "Hello there." and streamed[-1].done


def test_empty_chat_or_prompt_loads_the_model(ol):
    assert ol.chat(model=MODEL, messages=[]).done_reason == "load"
    loaded = ol.generate(model=MODEL, prompt="", keep_alive="5m")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


# ---------------------------------------------------------------------- options
def test_options_num_predict_stop_and_seed(ol):
    cut = ol.chat(model=MODEL, messages=HELLO, options={"temperature": 0, "num_predict": 5})
    assert cut.message.content == "Hello" and cut.done_reason == "length" and cut.eval_count == 5
    stopped = ol.chat(model=MODEL, messages=HELLO, options={"temperature": 0, "stop": [" th"]})
    assert stopped.message.content == "Hello" and stopped.done_reason == "stop"
    sampled = {"temperature": 1.5, "top_k": 0, "top_p": 1.0, "seed": 7, "num_predict": 12}
    first = ol.generate(model=MODEL, prompt="zz", raw=True, options=sampled).response
    assert ol.generate(model=MODEL, prompt="zz", raw=True, options=sampled).response == first
    # Options Ollama ignores (unknown, or runner settings) change nothing.
    ignored = {**GREEDY, "num_thread": 4, "num_gpu": 1, "use_mmap": True, "numa": False, "no_such_option": 3}
    assert ol.chat(model=MODEL, messages=HELLO, options=ignored).message.content == "Hello there."


def test_penalties_are_the_v1_penalties(live, ol):
    prompt = "abababab"
    options = {"temperature": 0, "num_predict": 20, "repeat_penalty": 1.8, "repeat_last_n": 16}
    penalised = ol.generate(model=MODEL, prompt=prompt, raw=True, options=options).response
    v1 = client(live.url).completions.create(
        model=MODEL,
        prompt=prompt,
        temperature=0,
        max_tokens=20,
        extra_body={"repeat_penalty": 1.8, "repeat_last_n": 16},
    )
    assert penalised == v1.choices[0].text
    plain = ol.generate(model=MODEL, prompt=prompt, raw=True, options={"temperature": 0, "num_predict": 20})
    assert plain.response != penalised  # the penalty reached the engine
    presence = {"temperature": 0, "num_predict": 20, "presence_penalty": 1.5, "frequency_penalty": 0.5}
    v1 = client(live.url).completions.create(
        model=MODEL, prompt=prompt, temperature=0, max_tokens=20, presence_penalty=1.5, frequency_penalty=0.5
    )
    assert ol.generate(model=MODEL, prompt=prompt, raw=True, options=presence).response == v1.choices[0].text


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"mirostat": 2}, "mirostat"),
        ({"typical_p": 0.7}, "typical_p"),
        ({"tfs_z": 0.5}, "tfs_z"),
        ({"repeat_penalty": 1.2, "penalize_newline": False}, "penalize_newline"),
        ({"num_ctx": 1_000_000}, "num_ctx"),
        ({"temperature": "hot"}, "temperature"),
        ({"presence_penalty": 5.0}, "presence_penalty"),
    ],
)
def test_options_that_cannot_be_honoured_are_refused_by_name(ol, options, named):
    with pytest.raises(ollama.ResponseError) as caught:
        ol.chat(model=MODEL, messages=HELLO, options=options)
    assert caught.value.status_code == 400 and named in caught.value.error


def test_neutral_values_of_unapplied_samplers_are_accepted(ol):
    options = {**GREEDY, "mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0, "penalize_newline": False, "num_ctx": 2048}
    assert ol.chat(model=MODEL, messages=HELLO, options=options).message.content == "Hello there."


def test_num_ctx_bounds_prompt_and_answer(ol):
    answer = ol.chat(model=MODEL, messages=HELLO, options={"temperature": 0, "num_ctx": 12})
    assert answer.prompt_eval_count + answer.eval_count == 12 and answer.done_reason == "length"
    with pytest.raises(ollama.ResponseError) as caught:
        ol.chat(model=MODEL, messages=HELLO, options={"num_ctx": 4})
    assert caught.value.status_code == 400 and "num_ctx" in caught.value.error


# ---------------------------------------------------------------------- format and tools
def test_format_schema_and_json(ol):
    for stream in (False, True):
        reply = ol.chat(model=MODEL, messages=HELLO, format=SCHEMA, options={"temperature": 0}, stream=stream)
        text = reply.message.content if not stream else "".join(c.message.content for c in reply)
        jsonschema.validate(json.loads(text), SCHEMA)
    generated = ol.generate(model=MODEL, prompt="a record", format=SCHEMA, options={"temperature": 0})
    jsonschema.validate(json.loads(generated.response), SCHEMA)
    assert isinstance(json.loads(ol.chat(model=MODEL, messages=HELLO, format="json").message.content), dict)
    with pytest.raises(ollama.ResponseError) as caught:
        ol.chat(model=MODEL, messages=HELLO, format={"type": "object", "properties": {"x": {"type": "nonsense"}}})
    assert caught.value.status_code == 400 and "format" in caught.value.error


def test_tool_call_whole_and_streamed(live, ol):
    messages = [{"role": "user", "content": "call"}]
    whole = ol.chat(model=MODEL, messages=messages, tools=TOOLS, options={"temperature": 0})
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert whole.message.content == "Let me look." and whole.done_reason == "stop"
    chunks = list(ol.chat(model=MODEL, messages=messages, tools=TOOLS, options={"temperature": 0}, stream=True))
    streamed = [c for chunk in chunks for c in chunk.message.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in streamed] == [("get_weather", {"city": "Paris"})]
    assert "".join(c.message.content for c in chunks).strip() == "Let me look."
    assert CALL not in "".join(c.message.content for c in chunks)
    # Cut inside the call (num_predict): no call, the text is content, streamed or not.
    cut = {"temperature": 0, "num_predict": 70}
    whole_cut = ol.chat(model=MODEL, messages=messages, tools=TOOLS, options=cut)
    assert whole_cut.message.tool_calls is None and whole_cut.message.content.startswith("Let me look.\n<tool_call>")
    chunks = list(ol.chat(model=MODEL, messages=messages, tools=TOOLS, options=cut, stream=True))
    assert "".join(c.message.content for c in chunks) == whole_cut.message.content
    v1 = client(live.url).chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, temperature=0)
    assert json.loads(v1.choices[0].message.tool_calls[0].function.arguments) == call.function.arguments


def test_two_calls_and_the_tool_results_turn(ol):
    two = ol.chat(model=MODEL, messages=[{"role": "user", "content": "two"}], tools=TOOLS, options={"temperature": 0})
    assert [c.function.name for c in two.message.tool_calls] == ["get_weather", "get_time"]
    history = [
        {"role": "user", "content": "call"},
        {"role": "assistant", "content": "", "tool_calls": [c.model_dump() for c in two.message.tool_calls[:1]]},
        {"role": "tool", "content": "11 degrees celsius", "tool_name": "get_weather"},
    ]
    reply = ol.chat(model=MODEL, messages=history, tools=TOOLS, options={"temperature": 0})
    assert reply.message.content == "It is sunny in Paris." and not reply.message.tool_calls


def test_tools_refused_with_format_or_bad_tools(ol):
    with pytest.raises(ollama.ResponseError) as caught:
        ol.chat(model=MODEL, messages=HELLO, tools=TOOLS, format="json")
    assert caught.value.status_code == 400 and "format" in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        ol.chat(model=MODEL, messages=HELLO, tools=[{"type": "function", "function": {"name": "bad name!"}}])
    assert caught.value.status_code == 400 and "name" in caught.value.error


# ---------------------------------------------------------------------- fill in the middle
def test_generate_with_suffix_is_the_fim_completion(fim_live):
    ol = ollama.Client(host=fim_live.url, timeout=60)
    options = {"temperature": 0, "num_predict": 12}
    answer = ol.generate(model=MODEL, prompt="def add(a, b):\n    ", suffix="\n    return c\n", options=options)
    v1 = client(fim_live.url).completions.create(
        model=MODEL, prompt="def add(a, b):\n    ", suffix="\n    return c\n", temperature=0, max_tokens=12
    )
    assert answer.response == v1.choices[0].text and answer.eval_count == v1.usage.completion_tokens
    assert "insert" in ol.show(MODEL).capabilities


def test_suffix_on_a_model_without_fim_tokens_is_refused(ol):
    with pytest.raises(ollama.ResponseError) as caught:
        ol.generate(model=MODEL, prompt="def f(", suffix="\n")
    assert caught.value.status_code == 400 and "insert" in caught.value.error


# ---------------------------------------------------------------------- models
def test_model_routes(live, ol):
    (listed,) = ol.list().models
    assert listed.model == MODEL + ":latest" and len(listed.digest) == 64
    shown = ol.show(MODEL + ":latest")
    engine = live.engine
    assert shown.modelinfo["general.architecture"] == "draftwise"
    assert shown.modelinfo["draftwise.context_length"] == engine.target.n_ctx
    assert shown.template == engine.tokenizer.chat_template and "tools" in shown.capabilities
    assert f"num_ctx {engine.target.n_ctx}" in shown.parameters
    (running,) = ol.ps().models
    assert running.model == MODEL + ":latest" and running.context_length == engine.target.n_ctx
    assert httpx.get(f"{live.url}/api/version").json()["version"].count(".") == 2
    assert httpx.get(f"{live.url}/").text == "Ollama is running"
    assert httpx.head(f"{live.url}/").status_code == 200


def test_pull(ol):
    statuses = [p.status for p in ol.pull(MODEL, stream=True)]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert ol.pull(MODEL + ":latest").status == "success"
    with pytest.raises(ollama.ResponseError) as caught:
        ol.pull(DEFAULT_TARGET)
    assert caught.value.status_code == 400 and f"draftwise pull {DEFAULT_TARGET}" in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        ol.pull("llama3.2")
    assert caught.value.status_code == 404 and "draftwise pull" in caught.value.error


# ---------------------------------------------------------------------- errors
def test_unknown_model_is_ollamas_404(ol):
    for call in (
        lambda: ol.chat(model="llama3.2", messages=HELLO),
        lambda: ol.generate(model=MODEL + ":7b", prompt="x"),
        lambda: ol.show("llama3.2"),
    ):
        with pytest.raises(ollama.ResponseError) as caught:
            call()
        assert caught.value.status_code == 404 and caught.value.error.startswith("model '")


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, "images"),
        ({"messages": HELLO, "think": True}, "thinking"),
        ({"messages": [{"role": "narrator", "content": "hi"}]}, "role"),
        ({"messages": "hi"}, "messages"),
    ],
)
def test_bad_chat_requests_answer_ollamas_error_shape(live, body, named):
    response = httpx.post(f"{live.url}/api/chat", json={"model": MODEL, **body}, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert isinstance(error, str) and named in error


def test_generate_refuses_template_and_context(ol):
    for kwargs, named in (({"template": "{{ .Prompt }}"}, "template"), ({"context": [1, 2]}, "context")):
        with pytest.raises(ollama.ResponseError) as caught:
            ol.generate(model=MODEL, prompt="hello", **kwargs)
        assert caught.value.status_code == 400 and named in caught.value.error


def test_curl_form_body_is_read_as_json(live):
    body = json.dumps({"model": MODEL, "prompt": "u:hello\nA>", "raw": True, "stream": False, "options": GREEDY})
    response = httpx.post(
        f"{live.url}/api/generate",
        content=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},  # what `curl -d` sends
        timeout=30,
    )
    assert response.status_code == 200 and response.json()["response"] == "Hello there."


def test_api_keys_guard_the_ollama_routes():
    with LiveServer(plain_engine(), api_key=API_KEY) as server:
        with pytest.raises(ollama.ResponseError) as caught:
            ollama.Client(host=server.url).chat(model=MODEL, messages=HELLO)
        assert caught.value.status_code == 401 and "API key" in caught.value.error
        keyed = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {API_KEY}"})
        assert keyed.chat(model=MODEL, messages=HELLO, options={"num_predict": 3, "temperature": 0}).eval_count == 3
        assert keyed.list().models[0].model == MODEL + ":latest"


def test_one_tenant_is_not_told_what_another_left_in_the_cache():
    engine = plain_engine()
    with LiveServer(engine, app=create_app(engine, MODEL, api_keys=("key-a", "key-b"))) as server:
        body = {"model": MODEL, "prompt": "a shared prompt both tenants send", "raw": True, "stream": False}
        body["options"] = {"num_predict": 4}

        def ask(key: str) -> dict:
            headers = {"Authorization": f"Bearer {key}"}
            response = httpx.post(f"{server.url}/api/generate", json=body, headers=headers, timeout=30)
            assert response.status_code == 200, response.text
            return response.json()

        first, other, again = ask("key-a"), ask("key-b"), ask("key-b")
    assert first["speculative"]["num_reused_tokens"] == 0 and "prompt_eval_duration" in first
    # b's first request found a's prompt in the cache: neither the count nor the times say so
    assert other["speculative"]["num_reused_tokens"] == 0 and other["speculative"]["prefill_ms"] is None
    assert not {"prompt_eval_duration", "eval_duration", "total_duration"} & set(other)
    assert other["prompt_eval_count"] == first["prompt_eval_count"]
    # b's own cache is b's to know
    assert again["speculative"]["num_reused_tokens"] > 0 and "prompt_eval_duration" in again


# ---------------------------------------------------------------------- LangChain
def test_langchain_chat_ollama(live):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_ollama import ChatOllama

    llm = ChatOllama(model=MODEL, base_url=live.url, temperature=0, num_predict=200)
    reply = llm.invoke("hello")
    assert reply.content == "Hello there."
    assert reply.usage_metadata["output_tokens"] == len("Hello there.")
    assert "".join(chunk.content for chunk in llm.stream("hello")) == "Hello there."

    with_tools = llm.bind_tools(TOOLS)
    called = with_tools.invoke("call")
    (call,) = called.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    answered = with_tools.invoke(
        [HumanMessage("call"), called, ToolMessage("11 degrees celsius", tool_call_id=call["id"])]
    )
    assert answered.content == "It is sunny in Paris."

    structured = llm.with_structured_output(SCHEMA, method="json_schema").invoke("a record please")
    jsonschema.validate(structured, SCHEMA)
