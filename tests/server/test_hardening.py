"""What a demanding client or a security reviewer tries: text that is not valid Unicode, status
codes clients map to the right error class, unbounded requests, chunked bodies past the cap,
what the prefix cache tells one tenant about another, and logs that never quote a request.
"""

from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftwise.server import create_app
from draftwise.server.errors import MAX_BODY_BYTES
from tests.server.conftest import MODEL, LiveServer, make_engine
from tests.server.test_server import chat, client

SECRET = "zebra-quartz-77"  # request content that must never reach the logs


def post(url, path, body, **kwargs):
    # json.dumps escapes a lone surrogate as \\udfff (valid JSON); httpx's json= cannot encode it.
    return httpx.post(f"{url}{path}", content=json.dumps(body).encode(), timeout=30,
                      headers={"content-type": "application/json"}, **kwargs)


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"model": MODEL, "prompt": "x\udfff"}),
    ("/v1/chat/completions", {"model": MODEL, "messages": chat("abc \ud800 def")}),
])
def test_a_lone_surrogate_is_a_400_naming_it(server, path, body):
    r = post(server.url, path, body)
    assert r.status_code == 400, r.text
    assert "lone surrogate" in r.json()["error"]["message"] and "U+D" in r.json()["error"]["message"]


def test_context_overflow_and_schema_errors_are_400_as_clients_expect(server):
    c = client(server.url)
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(model=MODEL, prompt="hi", max_tokens=1_000_000_000)
    assert info.value.code == "context_length_exceeded" and "4096" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model=MODEL, messages=chat("hi"), max_completion_tokens=5000)
    assert info.value.code == "context_length_exceeded" and info.value.param == "max_completion_tokens"
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        c.completions.create(model=MODEL, prompt="hi", max_tokens=0)


def test_smaller_messages_name_the_rule(server):
    r = post(server.url, "/v1/completions", {"model": MODEL, "prompt": "hi", "stop": ["a"] * 17})
    assert r.status_code == 400 and "at most 16" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/completions", content=b'{"model": "toy-40", "prompt": "hi"}',
                   headers={"content-type": "text/plain"}, timeout=30)
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    r = post(server.url, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": None}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.content"
    assert httpx.get(f"{server.url}/docs").status_code == 404  # no CDN-backed pages


def test_a_chunked_body_over_the_cap_is_refused(server):
    def chunks():
        piece = b" " * (1 << 20)
        yield b'{"model": "toy-40", "prompt": "'
        for _ in range(MAX_BODY_BYTES // len(piece) + 1):
            yield piece
        yield b'"}'

    r = httpx.post(f"{server.url}/v1/completions", content=chunks(), headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert client(server.url).completions.create(model=MODEL, prompt="ok", max_tokens=3).usage.completion_tokens == 3


def test_one_tenant_is_not_told_what_another_left_in_the_cache(start_server):
    engine = make_engine()
    live = LiveServer(engine, app=create_app(engine, MODEL, api_keys=("key-a", "key-b"))).__enter__()
    try:
        prompt = "a shared system prompt that both tenants send first"
        a = client(live.url, api_key="key-a").completions.create(model=MODEL, prompt=prompt, max_tokens=4)
        b1 = client(live.url, api_key="key-b").completions.create(model=MODEL, prompt=prompt, max_tokens=4)
        b2 = client(live.url, api_key="key-b").completions.create(model=MODEL, prompt=prompt, max_tokens=4)
    finally:
        live.__exit__(None, None, None)
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    assert b1.usage.prompt_tokens_details.cached_tokens == 0  # the reuse came from tenant a
    assert b1.usage.model_extra["speculative"]["num_reused_tokens"] == 0
    assert b2.usage.prompt_tokens_details.cached_tokens > 0  # its own earlier request


class Exploding:
    """An engine whose tokenizer fails with the request's text in the exception message."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def encode_prompt(self, prompt=None, messages=None):
        raise RuntimeError(f"tokenizer exploded on {prompt or messages!r}")


@pytest.mark.parametrize("log_content", [False, True])
def test_logs_never_quote_a_request_unless_asked(caplog, log_content):
    caplog.set_level(logging.INFO)
    engine = Exploding(make_engine())
    with LiveServer(engine, app=create_app(engine, MODEL, log_content=log_content)) as live:
        r = post(live.url, "/v1/completions", {"model": MODEL, "prompt": f"tell me {SECRET}"})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert SECRET not in r.text
        post(live.url, "/v1/chat/completions", {"model": MODEL, "messages": chat(f"{SECRET} \udfff")})
    logged = "\n".join(rec.getMessage() + (str(rec.exc_info[1]) if rec.exc_info else "") for rec in caplog.records
                       if rec.levelno >= logging.INFO)
    assert "RuntimeError" in logged  # the failure itself is logged ...
    assert (SECRET in logged) == log_content  # ... its content only on request


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=300))
def test_no_unicode_input_gets_a_server_error(server, text):
    for path, body in (("/v1/completions", {"model": MODEL, "prompt": text or "x", "max_tokens": 2}),
                       ("/v1/chat/completions", {"model": MODEL, "messages": chat(text), "max_tokens": 2,
                                                 "stop": [text] if text else None})):
        r = post(server.url, path, body)
        assert r.status_code < 500, r.text
