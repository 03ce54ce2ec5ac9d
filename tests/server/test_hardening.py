"""What a demanding client or a security reviewer tries: text that is not valid Unicode, status
codes clients map to the right error class, unbounded requests, chunked bodies past the cap,
what the prefix cache (usage, /metrics) tells one tenant about another, logs that never quote
a request, bodies the parser cannot read, headers and bodies sent slowly (raw sockets against
both of uvicorn's parsers), and a request big enough to hold the event loop.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

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
    return httpx.post(
        f"{url}{path}",
        content=json.dumps(body).encode(),
        timeout=30,
        headers={"content-type": "application/json"},
        **kwargs,
    )


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"model": MODEL, "prompt": "x\udfff"}),
        ("/v1/chat/completions", {"model": MODEL, "messages": chat("abc \ud800 def")}),
    ],
)
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
        c.completions.create(model=MODEL, prompt="hi", max_tokens=-1)  # 0 is valid: with echo it scores the prompt


def test_smaller_messages_name_the_rule(server):
    r = post(server.url, "/v1/completions", {"model": MODEL, "prompt": "hi", "stop": ["a"] * 17})
    assert r.status_code == 400 and "at most 16" in r.json()["error"]["message"]
    r = httpx.post(
        f"{server.url}/v1/completions",
        content=b'{"model": "toy-40", "prompt": "hi"}',
        headers={"content-type": "text/plain"},
        timeout=30,
    )
    assert r.status_code == 415 and "Content-Type: application/json" in r.json()["error"]["message"]
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

    r = httpx.post(
        f"{server.url}/v1/completions", content=chunks(), headers={"content-type": "application/json"}, timeout=60
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    # greedy: a sampled answer may end (EOS) before max_tokens
    done = client(server.url).completions.create(model=MODEL, prompt="ok", max_tokens=3, temperature=0)
    assert done.usage.completion_tokens == 3


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
    # Times that shrink with reuse (target prefill, the draft model's catch-up) are not told either.
    timings = ("prefill_ms", "decode_ms", "draft_ms", "tokens_per_second", "tokens_per_second_e2e")
    assert all(b1.usage.model_extra["speculative"][name] is None for name in timings)
    assert all(b2.usage.model_extra["speculative"][name] is not None for name in timings)
    assert b2.usage.model_extra["speculative"]["prefill_ms"] >= 0


def test_metrics_answer_the_operator_alone_when_tenants_share_a_server():
    engine = make_engine()
    app = create_app(engine, MODEL, api_keys=("key-a", "key-b"), metrics_key="ops-key")
    with LiveServer(engine, app=app) as live:
        client(live.url, api_key="key-a").completions.create(model=MODEL, prompt="some prompt", max_tokens=2)

        def scrape(key=None):
            return httpx.get(f"{live.url}/metrics", headers={"authorization": f"Bearer {key}"} if key else {})

        assert scrape("key-a").status_code == 403 and scrape("key-a").json()["error"]["code"] == "permission_denied"
        assert scrape().status_code == 401 and scrape("nonsense").status_code == 401
        r = scrape("ops-key")
        assert r.status_code == 200 and "draftwise_reused_prompt_tokens_total" in r.text
        with pytest.raises(openai.AuthenticationError):  # the metrics key is no API key
            client(live.url, api_key="ops-key").models.list()
    app = create_app(engine, MODEL, api_keys=("key-a", "key-b"))  # no metrics key: nobody reads them
    with LiveServer(engine, app=app) as live:
        r = httpx.get(f"{live.url}/metrics", headers={"authorization": "Bearer key-a"})
        assert r.status_code == 403 and "metrics key" in r.json()["error"]["message"]
    with LiveServer(engine, app=create_app(engine, MODEL, api_key="only-key")) as live:  # one tenant: its metrics
        assert httpx.get(f"{live.url}/metrics", headers={"authorization": "Bearer only-key"}).status_code == 200


class Exploding:
    """An engine whose tokenizer fails with the request's text in the exception message."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def encode_prompt(self, prompt=None, messages=None, tools=None):
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
    logged = "\n".join(
        rec.getMessage() + (str(rec.exc_info[1]) if rec.exc_info else "")
        for rec in caplog.records
        if rec.levelno >= logging.INFO
    )
    assert "RuntimeError" in logged  # the failure itself is logged ...
    assert (SECRET in logged) == log_content  # ... its content only on request


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=300))
def test_no_unicode_input_gets_a_server_error(server, text):
    for path, body in (
        ("/v1/completions", {"model": MODEL, "prompt": text or "x", "max_tokens": 2}),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": chat(text), "max_tokens": 2, "stop": [text] if text else None},
        ),
    ):
        r = post(server.url, path, body)
        assert r.status_code < 500, r.text


# ---------------------------------------------------------------------- bodies the parser refuses
@pytest.mark.parametrize(
    "body, code, words",
    [
        (b'{"model": "toy-40", "prompt": "caf\xe9"}', "invalid_encoding", "UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "json_too_deep", "too deeply"),
    ],
)
def test_unreadable_bodies_are_specific_400s(server, body, code, words):
    r = httpx.post(
        f"{server.url}/v1/completions", content=body, headers={"content-type": "application/json"}, timeout=30
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code and words in r.json()["error"]["message"]


# ---------------------------------------------------------------------- below the app: uvicorn
IMPATIENT_DEADLINE_S = 0.5  # for the headers and for the body
IMPATIENT_STEP_S = 0.05  # what each target forward takes


@pytest.fixture(scope="module", params=["httptools", "h11"])
def impatient(request):
    """A server with deadlines of half a second for headers and for the body, on either of
    uvicorn's HTTP parsers."""
    if request.param == "httptools":
        pytest.importorskip("httptools")
    engine = make_engine(step_delay_s=IMPATIENT_STEP_S, draft_model=False)
    with LiveServer(
        engine,
        app=create_app(engine, MODEL, body_timeout_s=IMPATIENT_DEADLINE_S),
        header_timeout_s=IMPATIENT_DEADLINE_S,
        http=request.param,
    ) as live:
        yield live


def raw_exchange(url: str, data: bytes, patience_s: float = 30.0) -> tuple[bytes, bool]:
    """Send data on a fresh connection; return what came back, and whether the server closed the
    connection (False: still open after patience_s; without the deadlines uvicorn keeps such a
    connection open for ever)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=patience_s) as sock:
        sock.sendall(data)
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return received, False
            if not chunk:
                return received, True
            received += chunk


def test_a_negative_content_length_is_a_json_400(impatient):
    reply, _ = raw_exchange(
        impatient.url,
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: -1\r\n"
        b"Content-Type: application/json\r\n\r\n{}",
    )
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "malformed_request" and error["type"] == "invalid_request_error"


def test_half_sent_headers_do_not_hold_a_connection(impatient):
    _, closed = raw_exchange(impatient.url, b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n")
    assert closed
    # Also on a kept-alive connection, whose idle timer stops at the first byte of the next request.
    reply, closed = raw_exchange(impatient.url, b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\nGET /hea")
    assert reply.startswith(b"HTTP/1.1 200") and closed


def test_a_trickled_body_gets_a_408(impatient):
    reply, closed = raw_exchange(
        impatient.url,
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n"
        b'\r\n{"model": ',
    )
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and closed
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_the_deadlines_leave_long_answers_and_kept_alive_connections_alone(impatient):
    with httpx.Client(base_url=impatient.url, timeout=30) as http:
        for _ in range(2):  # one connection: the second request comes after the first answer
            r = http.post(
                "/v1/completions",
                json={
                    "model": MODEL,
                    "prompt": "ab",
                    "max_tokens": 20,
                    "ignore_eos": True,
                    "speculation": {"enabled": False},  # a token per step: the answer takes 20 steps
                },
            )
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 20
            # longer than either deadline: each of its steps' forwards took IMPATIENT_STEP_S
            assert r.json()["usage"]["speculative"]["num_steps"] * IMPATIENT_STEP_S > IMPATIENT_DEADLINE_S
        with http.stream(
            "POST",
            "/v1/completions",
            json={
                "model": MODEL,
                "prompt": "ab",
                "max_tokens": 20,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ) as stream:
            events = [line for line in stream.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["usage"]["completion_tokens"] == 20


# ---------------------------------------------------------------------- the event loop stays free
def test_a_huge_prediction_never_holds_the_event_loop(start_server):
    live = start_server(make_engine(step_delay_s=0.02, draft_model=False))
    serving, health_while_tokenising = live.app.state.serving, []
    submit = serving.submit  # checks and tokenises the prediction (Engine.stream)

    def submit_asking_health(job, sampling, speculation, drafters, prediction=None, *rest):
        if prediction is not None:
            health_while_tokenising.append(httpx.get(f"{live.url}/health", timeout=10).json())
        return submit(job, sampling, speculation, drafters, prediction, *rest)

    serving.submit = submit_asking_health
    with (
        httpx.Client(base_url=live.url, timeout=60) as http,
        http.stream(
            "POST",
            "/v1/completions",
            json={"model": MODEL, "prompt": "ab", "max_tokens": 2000, "ignore_eos": True, "stream": True},
        ) as running,
    ):
        lines = running.iter_lines()
        next(lines)  # another client's stream is running
        body = json.dumps(
            {
                "model": MODEL,
                "prompt": "ab",
                "max_tokens": 2,
                "prediction": {"type": "content", "content": "abcdefgh" * (12 * 1024 * 1024 // 8)},
            }
        ).encode()  # 12 MB
        answers = []
        sent = threading.Thread(
            target=lambda: answers.append(
                httpx.post(
                    f"{live.url}/v1/completions", content=body, headers={"content-type": "application/json"}, timeout=60
                )
            )
        )
        sent.start()
        queued = False
        while not queued and sent.is_alive():  # until it waits for the slot: read, parsed, tokenised
            queued = http.get("/health").json()["queue_length"] == 1
            time.sleep(0.02)
    sent.join(30)
    assert queued and answers[0].status_code == 200
    # /health answered from inside the call that checks and tokenises the prediction, beside the
    # running stream: that call runs off the event loop (on it, /health would time out, the request fail).
    assert [h["status"] for h in health_while_tokenising] == ["ok"] and health_while_tokenising[0]["running"]
