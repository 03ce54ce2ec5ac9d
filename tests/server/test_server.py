"""The server through the official `openai` client against a live uvicorn on loopback.

Every expected output comes from a fresh Engine over the same toy tables (the reference),
so a wrong, truncated or interleaved stream fails the comparison.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

import httpx
import openai
import pytest

from draftwise.types import SamplingParams
from tests.server.conftest import API_KEY, MODEL, make_engine

GREEDY = dict(temperature=0.0)


def client(url: str, api_key: str = "unused", **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=30, **kwargs)


def reference(prompt: str | None = None, messages: list[dict] | None = None, **sampling) -> str:
    return make_engine().generate(prompt, messages=messages, sampling=SamplingParams(**sampling)).text


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


# ---------------------------------------------------------------------- happy paths
def test_chat_non_streaming_matches_the_engine_and_reports_usage(server):
    resp = client(server.url).chat.completions.create(
        model=MODEL, messages=chat("hello there"), max_completion_tokens=24, **GREEDY
    )
    assert resp.choices[0].message.content == reference(messages=chat("hello there"), max_tokens=24)
    assert resp.choices[0].finish_reason == "length"
    usage = resp.usage
    assert usage.completion_tokens == 24
    assert usage.total_tokens == usage.prompt_tokens + 24
    spec = usage.model_extra["speculative"]
    assert spec["num_generated"] == 24 and spec["num_prompt_tokens"] == usage.prompt_tokens
    assert spec["num_drafted"] > 0 and 0 <= spec["acceptance_rate"] <= 1
    assert spec["tokens_per_step"] > 1  # the toy draft shares the target's argmax
    assert len(spec["accepted_per_position"]) == 4 and spec["drafter_choices"] == {"draft": spec["num_steps"]}


def test_completion_streaming_with_usage(server):
    stream = client(server.url).completions.create(
        model=MODEL,
        prompt="the quick brown fox",
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == reference("the quick brown fox", max_tokens=30)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30
    assert chunks[-1].usage.model_extra["speculative"]["num_generated"] == 30
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_streaming_starts_with_the_role_and_ends_with_done(server):
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        timeout=30,
        json={"model": MODEL, "messages": chat("stream me"), "max_tokens": 20, "stream": True, "temperature": 0},
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    stream = client(server.url).chat.completions.create(
        model=MODEL, messages=chat("stream me"), max_tokens=20, stream=True, **GREEDY
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == reference(
        messages=chat("stream me"), max_tokens=20
    )
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage is None


def test_answers_carry_llama_servers_timings_on_their_last_chunk(server):
    """llama-server's per-request `timings` on the whole answer and on each choice's last chunk
    (predicted_n counts the sampled tokens, the EOS included, as llama.cpp's n_decoded)."""
    resp = client(server.url).chat.completions.create(model=MODEL, messages=chat("time me"), max_tokens=12, **GREEDY)
    timings = resp.model_extra["timings"]
    spec = resp.usage.model_extra["speculative"]
    assert timings["predicted_n"] == spec["num_generated"] + spec["num_eos"] == 12
    assert timings["prompt_n"] == resp.usage.prompt_tokens - spec["num_reused_tokens"]
    assert timings["predicted_ms"] == spec["decode_ms"] and timings["predicted_per_second"] > 0
    openai_client = client(server.url)
    streams = (
        openai_client.chat.completions.create(
            model=MODEL, messages=chat("time me"), max_tokens=12, stream=True, **GREEDY
        ),
        openai_client.completions.create(model=MODEL, prompt="time me", max_tokens=12, stream=True, **GREEDY),
    )
    for stream in streams:
        chunks = list(stream)
        with_timings = [c for c in chunks if (c.model_extra or {}).get("timings")]
        assert with_timings == [chunks[-1]] and chunks[-1].model_extra["timings"]["predicted_n"] == 12


def test_seeded_sampling_with_extensions_is_reproducible(server):
    params = dict(temperature=0.9, top_p=0.95, seed=1234)
    extra = {"top_k": 8, "min_p": 0.01}
    c = client(server.url)
    first = c.completions.create(model=MODEL, prompt="sample", max_tokens=40, extra_body=extra, **params)
    again = c.completions.create(model=MODEL, prompt="sample", max_tokens=40, extra_body=extra, **params)
    expected = reference("sample", max_tokens=40, top_k=8, min_p=0.01, **params)
    assert first.choices[0].text == again.choices[0].text == expected
    other_seed = c.completions.create(
        model=MODEL, prompt="sample", max_tokens=40, extra_body=extra, **{**params, "seed": 99}
    )
    assert other_seed.choices[0].text != expected


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_output(server, stream):
    full = reference(messages=chat("stop test"), max_tokens=60)
    stop = full[10:12]
    expected = full[: full.find(stop)]
    resp = client(server.url).chat.completions.create(
        model=MODEL, messages=chat("stop test"), max_tokens=60, stop=[stop, "never-appears"], stream=stream, **GREEDY
    )
    if stream:
        chunks = list(resp)
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        text, finish = resp.choices[0].message.content, resp.choices[0].finish_reason
    assert (text, finish) == (expected, "stop")


def test_token_id_prompts_and_models(server):
    c = client(server.url)
    ids = make_engine().tokenizer.encode("abc")
    resp = c.completions.create(model=MODEL, prompt=ids, max_tokens=10, **GREEDY)
    assert resp.choices[0].text == reference("abc", max_tokens=10)
    assert [m.id for m in c.models.list()] == [MODEL]
    assert c.models.retrieve(MODEL).id == MODEL


def test_multi_turn_chat_reuses_the_prefix_for_target_and_draft(start_server):
    live = start_server()
    c = client(live.url)
    history = chat("write a poem about caches")
    first = c.chat.completions.create(model=MODEL, messages=history, max_tokens=30, **GREEDY)
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "shorter please"},
    ]
    second = c.chat.completions.create(model=MODEL, messages=history, max_tokens=30, **GREEDY)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    spec = second.usage.model_extra["speculative"]
    # the whole first prompt and part of the answer were already in both caches
    assert second.usage.prompt_tokens_details.cached_tokens == spec["num_reused_tokens"] > first.usage.prompt_tokens
    assert spec["num_draft_reused_tokens"] > first.usage.prompt_tokens
    assert second.choices[0].message.content == reference(messages=history, max_tokens=30)
    assert metric(live.url, 'draftwise_reused_prompt_tokens_total{model="draft"}') > 0


# ---------------------------------------------------------------------- errors
BAD_REQUESTS = [
    ("malformed JSON", "/v1/chat/completions", b'{"model": "toy-40", "messages": [', 400, None),
    ("not an object", "/v1/completions", b"[1, 2]", 400, None),
    ("missing messages", "/v1/chat/completions", {"model": MODEL}, 400, "messages"),
    ("missing model", "/v1/completions", {"prompt": "hi"}, 400, "model"),
    ("wrong type", "/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400, "messages"),
    ("string number", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": "5"}, 400, "max_tokens"),
    (
        "bad role",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
        400,
        "messages.0.role",
    ),
    (
        "temperature out of range",
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "temperature": 3},
        400,
        "temperature",
    ),
    ("top_p zero", "/v1/completions", {"model": MODEL, "prompt": "hi", "top_p": 0}, 400, "top_p"),
    (
        "max_tokens zero",
        "/v1/chat/completions",
        {"model": MODEL, "messages": chat("x"), "max_tokens": 0},
        400,
        "max_tokens",
    ),
    ("empty stop", "/v1/completions", {"model": MODEL, "prompt": "hi", "stop": [""]}, 400, "stop.0"),
    ("n = 0", "/v1/chat/completions", {"model": MODEL, "messages": chat("x"), "n": 0}, 400, "n"),
    (
        "top_logprobs 21",
        "/v1/chat/completions",
        {"model": MODEL, "messages": chat("x"), "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
    ),
    (
        "top_logprobs alone",
        "/v1/chat/completions",
        {"model": MODEL, "messages": chat("x"), "top_logprobs": 2},
        400,
        "top_logprobs",
    ),
    ("completions logprobs 6", "/v1/completions", {"model": MODEL, "prompt": "a", "logprobs": 6}, 400, "logprobs"),
    (
        "presence_penalty 3",
        "/v1/completions",
        {"model": MODEL, "prompt": "a", "presence_penalty": 3},
        400,
        "presence_penalty",
    ),
    (
        "logit_bias 101",
        "/v1/completions",
        {"model": MODEL, "prompt": "a", "logit_bias": {"3": 101}},
        400,
        "logit_bias.3",
    ),
    ("logit_bias key", "/v1/completions", {"model": MODEL, "prompt": "a", "logit_bias": {"x": 1}}, 400, "logit_bias"),
    ("logit_bias id", "/v1/completions", {"model": MODEL, "prompt": "a", "logit_bias": {"400": 1}}, 400, None),
    (
        "repeat_penalty 0",
        "/v1/completions",
        {"model": MODEL, "prompt": "a", "repeat_penalty": 0},
        400,
        "repeat_penalty",
    ),
    ("token outside vocab", "/v1/completions", {"model": MODEL, "prompt": [1, 2, 400]}, 400, "prompt"),
    (
        "unknown drafter",
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "speculation": {"drafters": ["x"]}},
        400,
        None,
    ),
    ("unknown model", "/v1/chat/completions", {"model": "gpt-5", "messages": chat("x")}, 404, "model"),
    ("prompt too long", "/v1/completions", {"model": MODEL, "prompt": "a" * 5000}, 400, "prompt"),
    ("chat too long", "/v1/chat/completions", {"model": MODEL, "messages": chat("b" * 5000)}, 400, "messages"),
]


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_input_gets_an_openai_error(server, case):
    _, path, body, status, param = case
    kwargs = (
        {"content": body, "headers": {"content-type": "application/json"}}
        if isinstance(body, bytes)
        else {"json": body}
    )
    r = httpx.post(f"{server.url}{path}", timeout=30, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error" and "Traceback" not in r.text
    if param is not None:
        assert error["param"] == param


def test_errors_through_the_client_and_the_server_keeps_serving(server):
    c = client(server.url)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=chat("x"))
    with pytest.raises(openai.BadRequestError, match="n"):
        c.chat.completions.create(model=MODEL, messages=chat("x"), n=129)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.completions.create(model=MODEL, prompt="x", temperature=-1)
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(model=MODEL, prompt="z" * 5000)
    assert info.value.code == "context_length_exceeded"
    assert httpx.get(f"{server.url}/v1/nowhere").json()["error"]["code"] == "not_found"
    assert c.completions.create(model=MODEL, prompt="still alive", max_tokens=5, **GREEDY).choices[0].text
    assert metric(server.url, 'draftwise_errors_total{status="400",type="invalid_request_error"}') >= 3


def test_api_key_guards_every_route_but_health(start_server):
    live = start_server(api_key=API_KEY)
    with pytest.raises(openai.AuthenticationError):
        client(live.url, api_key="wrong").models.list()
    r = httpx.get(f"{live.url}/metrics")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{live.url}/openapi.json").status_code == 401
    assert httpx.get(f"{live.url}/health").json()["status"] == "ok"
    resp = client(live.url, api_key=API_KEY).chat.completions.create(model=MODEL, messages=chat("x"), max_tokens=3)
    assert resp.usage.completion_tokens <= 3


def test_metrics_count_what_was_served(start_server):
    live = start_server()
    c = client(live.url)
    usages = [c.completions.create(model=MODEL, prompt=p, max_tokens=20, **GREEDY).usage for p in ("one", "two")]
    text = httpx.get(f"{live.url}/metrics").text
    assert metric(live.url, "draftwise_generated_tokens_total") == sum(u.completion_tokens for u in usages)
    assert metric(live.url, 'draftwise_requests_total{endpoint="completions",finish_reason="length"}') == 2
    drafted = metric(live.url, "draftwise_drafted_tokens_total")
    accepted = metric(live.url, "draftwise_accepted_tokens_total")
    assert drafted > 0 and metric(live.url, "draftwise_acceptance_rate") == pytest.approx(accepted / drafted)
    assert metric(live.url, "draftwise_tokens_per_step") > 1
    for name in (
        'draftwise_accepted_per_position{position="0"}',
        'draftwise_drafter_steps_total{drafter="draft"}',
        'draftwise_planned_k_steps_total{k="4"}',
        "draftwise_queue_length",
        "draftwise_tokens_per_second",
        "draftwise_request_duration_seconds_count",
        "draftwise_time_to_first_token_seconds_count",
    ):
        assert re.search(rf"^{re.escape(name)} ", text, re.MULTILINE), name
    # Memory: the process's, the KV caches' (the prompts' tokens are held) and the drafters' state.
    assert metric(live.url, "process_resident_memory_bytes") > 0
    assert metric(live.url, 'draftwise_kv_cache_bytes{kind="used",model="target"}') > 0
    assert metric(live.url, 'draftwise_kv_cache_bytes{kind="used",model="draft"}') > 0
    assert re.search(r"^draftwise_drafter_state_bytes\{drafter=", text, re.MULTILINE)


# ---------------------------------------------------------------------- concurrency
def test_sixteen_concurrent_streams_all_complete_unmixed(server):
    prompts = [f"request number {i} says {chr(97 + i) * 3}" for i in range(16)]
    expected = [reference(p, max_tokens=32) for p in prompts]
    assert len(set(expected)) == 16  # otherwise interleaving could go unnoticed

    async def one(c: openai.AsyncOpenAI, prompt: str) -> str:
        stream = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=32, stream=True, **GREEDY)
        return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

    async def all_of_them() -> list[str]:
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as c:
            return await asyncio.gather(*(one(c, p) for p in prompts))

    assert asyncio.run(all_of_them()) == expected


def test_disconnect_cancels_and_the_next_request_matches_a_fresh_server(start_server, caplog):
    caplog.set_level(logging.INFO, logger="draftwise.server")
    live = start_server(make_engine(step_delay_s=0.002))
    c = client(live.url)
    stream = c.completions.create(
        model=MODEL,
        prompt="a long story about",
        max_tokens=3000,
        stream=True,
        extra_body={"ignore_eos": True},
        **GREEDY,
    )
    for _, _chunk in zip(range(3), stream):
        pass
    stream.close()  # drops the connection mid-stream
    ended = 'draftwise_requests_total{endpoint="completions",finish_reason="%s"}'
    while metric(live.url, ended % "cancelled") + metric(live.url, ended % "length") < 1:  # it ends either way
        time.sleep(0.02)
    assert metric(live.url, ended % "cancelled") == 1 and metric(live.url, ended % "length") == 0
    assert any("cancelled after" in r.getMessage() and "client disconnected" in r.getMessage() for r in caplog.records)
    assert metric(live.url, "draftwise_generated_tokens_total") < 3000

    follow_up = dict(model=MODEL, prompt="a long story about caches", max_tokens=40, temperature=0.8, seed=5)
    after_cancel = c.completions.create(**follow_up).choices[0].text
    fresh = client(start_server().url).completions.create(**follow_up).choices[0].text
    assert after_cancel == fresh == reference("a long story about caches", max_tokens=40, temperature=0.8, seed=5)


def test_openapi_schema_is_published(server):
    schema = httpx.get(f"{server.url}/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"} <= set(schema["paths"])
    assert "top_k" in schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]
