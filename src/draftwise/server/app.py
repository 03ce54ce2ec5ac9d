"""The HTTP surface: `create_app(engine, model_name, api_key=None) -> FastAPI`.

Routes /v1/completions and /v1/chat/completions (JSON or server-sent events),
/v1/models, /health, /metrics; every failure becomes OpenAI's error JSON with a fitting
4xx status (never a traceback), and a client that goes away cancels its generation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from draftwise.backends.base import BackendError
from draftwise.engine import Engine, PromptTooLongError
from draftwise.server import protocol as p
from draftwise.server.metrics import ServerMetrics
from draftwise.server.serving import Failed, Finished, Job, JobCancelled, Piece, Serving
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig

logger = logging.getLogger("draftwise.server")

MAX_BODY_BYTES = 16 * 1024 * 1024
DISCONNECT_POLL_S = 0.25
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint

_ERROR_STATUSES = {status: {"model": p.ErrorResponse} for status in (400, 401, 404, 413, 422, 500, 503)}
_STREAM_RESPONSE = {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                    "description": "JSON, or server-sent events when `stream` is true."}


class APIError(Exception):
    """An error answered with OpenAI's error JSON."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return p.ErrorResponse(error=p.ErrorDetail(message=self.message, type=self.type, param=self.param,
                                                   code=self.code)).model_dump()


class Guard:
    """ASGI middleware: bearer-token check (all routes but /health) and a body size cap."""

    def __init__(self, app, *, api_key: str | None, reply: Callable[[APIError], Response]) -> None:
        self.app, self.api_key, self.reply = app, api_key, reply

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            error = None
            if self.api_key is not None and scope["path"] != "/health":
                scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
                if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.api_key.encode()):
                    error = APIError(401, "missing or invalid API key (send 'Authorization: Bearer KEY')",
                                     code="invalid_api_key")
            length = headers.get(b"content-length", b"0")
            if error is None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
                error = APIError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="body_too_large")
            if error is not None:
                await self.reply(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(engine: Engine, model_name: str, api_key: str | None = None) -> FastAPI:
    metrics = ServerMetrics()
    serving = Serving(engine, metrics)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        serving.close()

    app = FastAPI(title="draftwise", summary="OpenAI-compatible server for lossless speculative decoding.",
                  lifespan=lifespan)
    app.state.serving = serving
    created = int(time.time())

    def reply(error: APIError) -> JSONResponse:
        count(error)
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    def count(error: APIError) -> None:
        metrics.observe_error(error.status, error.type)

    app.add_middleware(Guard, api_key=api_key, reply=reply)

    # ------------------------------------------------------------------ errors
    @app.exception_handler(APIError)
    async def _api_error(_request: Request, exc: APIError) -> JSONResponse:
        return reply(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        # A union field reports one error per member; the deepest one says most ("stop.0: too short").
        first = max(errors, key=lambda e: len(e["loc"]), default={"loc": (), "msg": "invalid request", "type": ""})
        if first["type"] == "json_invalid":
            return reply(APIError(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}",
                                  code="invalid_json"))
        param = ".".join(str(part) for part in first["loc"] if part != "body" and not _is_type_tag(part)) or None
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        return reply(APIError(422, f"{param or 'body'}: {first['msg']}{more}", param=param, code="invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code if 400 <= exc.status_code < 500 else 500
        return reply(APIError(status, str(exc.detail), type="invalid_request_error" if status < 500 else "server_error",
                              code={404: "not_found", 405: "method_not_allowed"}.get(status)))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        logger.error("unexpected error: %r", exc, exc_info=exc)
        return reply(APIError(500, "internal server error", type="server_error"))

    # ------------------------------------------------------------------ requests -> jobs
    def check_common(body: p._GenerationRequest) -> None:
        if body.model != model_name:
            raise APIError(404, f"the model {body.model!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found")
        if body.n not in (None, 1):
            raise APIError(400, f"n must be 1 (one completion per request), got {body.n}", param="n",
                           code="unsupported_value")
        field = body.unsupported()
        if field is not None:
            raise APIError(400, f"{field} is not supported by this server", param=field, code="unsupported_parameter")

    def sampling_of(body: p._GenerationRequest, max_tokens: int) -> SamplingParams:
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        return SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_k=body.top_k or 0, top_p=1.0 if body.top_p is None else body.top_p, min_p=body.min_p or 0.0,
            # numpy seeds must be non-negative; OpenAI's may be any integer
            seed=None if body.seed is None else body.seed % 2**64,
            max_tokens=max_tokens, stop=stop, ignore_eos=body.ignore_eos)

    def speculation_of(body: p._GenerationRequest) -> tuple[SpeculationConfig | None, list[str] | None]:
        options = body.speculation
        if options is None:
            return None, None
        base = engine.speculation
        max_k = options.max_draft_tokens or base.max_draft_tokens
        config = dataclasses.replace(
            base, policy=options.policy or base.policy, max_draft_tokens=max_k,
            min_draft_tokens=min(base.min_draft_tokens, max_k),
            enabled=base.enabled if options.enabled is None else options.enabled)
        return config, options.drafters

    async def start(body: p._GenerationRequest, endpoint: str, prefix: str, *, prompt: str | None = None,
                    messages: list[dict] | None = None, prompt_ids: list[int] | None = None,
                    default_max_tokens: int | None = None, max_tokens: int | None = None) -> Job:
        check_common(body)
        param = "messages" if messages is not None else "prompt"
        try:
            if prompt_ids is None:
                prompt_ids = await asyncio.to_thread(serving.encode, prompt, messages)
            remaining = max(1, engine.target.n_ctx - len(prompt_ids))
            sampling = sampling_of(body, max_tokens or default_max_tokens or remaining)
            speculation, drafters = speculation_of(body)
            return serving.submit(Job(f"{prefix}-{uuid.uuid4().hex[:24]}", endpoint, prompt_ids),
                                  sampling, speculation, drafters)
        except PromptTooLongError as exc:
            raise APIError(413, str(exc), param=param, code="context_length_exceeded") from None
        except ConfigError as exc:
            raise APIError(400, str(exc), code="invalid_value") from None
        except BackendError as exc:  # the tokenizer or chat template refused the input
            raise APIError(400, str(exc), param=param, code="invalid_prompt") from None
        except Exception as exc:
            if type(exc).__module__.startswith("jinja2"):  # a chat template's raise_exception()
                raise APIError(400, f"the chat template rejected the messages: {exc}", param="messages",
                               code="invalid_prompt") from None
            raise

    def usage_of(done: Finished) -> p.Usage:
        s = done.result.stats
        return p.Usage(
            prompt_tokens=s.num_prompt_tokens, completion_tokens=s.num_generated,
            total_tokens=s.num_prompt_tokens + s.num_generated,
            prompt_tokens_details=p.PromptTokensDetails(cached_tokens=s.num_reused_tokens),
            speculative=p.SpeculativeUsage(**s.to_dict(), num_draft_reused_tokens=done.num_draft_reused_tokens))

    # ------------------------------------------------------------------ routes
    @app.post("/v1/chat/completions", response_model=p.ChatCompletion, tags=["openai"],
              responses={200: _STREAM_RESPONSE, **_ERROR_STATUSES})
    async def chat_completions(body: p.ChatCompletionRequest, request: Request):
        messages = [_message_dict(i, m) for i, m in enumerate(body.messages)]
        job = await start(body, "chat", "chatcmpl", messages=messages,
                          max_tokens=body.max_completion_tokens or body.max_tokens)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        now = int(time.time())

        def chunk(delta: p.ChatDelta | None, finish: str | None = None, usage: p.Usage | None = None) -> str:
            choices = [] if delta is None else [p.ChatChunkChoice(delta=delta, finish_reason=finish)]
            return _sse(p.ChatCompletionChunk(id=job.id, created=now, model=model_name, choices=choices,
                                              usage=usage), include_usage)

        if body.stream:
            async def events() -> AsyncIterator[str]:
                yield chunk(p.ChatDelta(role="assistant", content=""))
                async for event in _job_events(job, request):
                    if isinstance(event, Piece):
                        yield chunk(p.ChatDelta(content=event.text))
                    elif isinstance(event, Finished):
                        yield chunk(p.ChatDelta(), _finish_reason(event))
                        if include_usage:
                            yield chunk(None, usage=usage_of(event))
                    else:
                        yield _sse_error(event, count)
                yield "data: [DONE]\n\n"

            return _event_stream(events())
        text, done = await _collect(job, request)
        return p.ChatCompletion(id=job.id, created=now, model=model_name, usage=usage_of(done),
                                choices=[p.ChatChoice(message=p.AssistantMessage(content=text),
                                                      finish_reason=_finish_reason(done))])

    @app.post("/v1/completions", response_model=p.Completion, tags=["openai"],
              responses={200: _STREAM_RESPONSE, **_ERROR_STATUSES})
    async def completions(body: p.CompletionRequest, request: Request):
        prompt, prompt_ids = _single_prompt(body.prompt, engine.target.vocab_size)
        job = await start(body, "completions", "cmpl", prompt=prompt, prompt_ids=prompt_ids,
                          default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS, max_tokens=body.max_tokens)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        now = int(time.time())

        def chunk(text: str | None, finish: str | None = None, usage: p.Usage | None = None) -> str:
            choices = [] if text is None else [p.CompletionChoice(text=text, finish_reason=finish)]
            return _sse(p.Completion(id=job.id, created=now, model=model_name, choices=choices, usage=usage),
                        include_usage)

        if body.stream:
            async def events() -> AsyncIterator[str]:
                async for event in _job_events(job, request):
                    if isinstance(event, Piece):
                        yield chunk(event.text)
                    elif isinstance(event, Finished):
                        yield chunk("", _finish_reason(event))
                        if include_usage:
                            yield chunk(None, usage=usage_of(event))
                    else:
                        yield _sse_error(event, count)
                yield "data: [DONE]\n\n"

            return _event_stream(events())
        text, done = await _collect(job, request)
        return p.Completion(id=job.id, created=now, model=model_name, usage=usage_of(done),
                            choices=[p.CompletionChoice(text=text, finish_reason=_finish_reason(done))])

    @app.get("/v1/models", response_model=p.ModelList, tags=["openai"], responses=_ERROR_STATUSES)
    async def list_models() -> p.ModelList:
        return p.ModelList(data=[p.ModelCard(id=model_name, created=created)])

    @app.get("/v1/models/{model_id:path}", response_model=p.ModelCard, tags=["openai"], responses=_ERROR_STATUSES)
    async def get_model(model_id: str) -> p.ModelCard:
        if model_id != model_name:
            raise APIError(404, f"the model {model_id!r} does not exist", param="model", code="model_not_found")
        return p.ModelCard(id=model_name, created=created)

    @app.get("/health", response_model=p.Health)
    async def health() -> p.Health:
        return p.Health(model=model_name, queue_length=serving.queue_length, running=serving.running is not None)

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}},
             description="Prometheus text format.")
    async def prometheus() -> Response:
        return Response(metrics.render(), headers={"Content-Type": metrics.content_type})

    return app


# ---------------------------------------------------------------------- helpers
def _message_dict(index: int, message: p.ChatMessage) -> dict[str, Any]:
    content = message.content
    if isinstance(content, list):
        for part in content:
            if part.type != "text" or part.text is None:
                raise APIError(400, f"only text content parts are supported, got type {part.type!r}",
                               param=f"messages.{index}.content", code="unsupported_value")
        content = "".join(part.text or "" for part in content)
    # Chat templates know system/user/assistant/tool; OpenAI's newer "developer" is a system message.
    return {"role": "system" if message.role == "developer" else message.role, "content": content or ""}


def _is_type_tag(part: str | int) -> bool:
    """pydantic names union members in error locations ('str', 'list[int]', 'constrained-str')."""
    return isinstance(part, str) and (part in {"str", "int", "float", "bool", "list", "dict"} or
                                      any(c in part for c in "[]-"))


def _single_prompt(prompt, vocab_size: int) -> tuple[str | None, list[int] | None]:
    """OpenAI's prompt forms -> (text, None) or (None, token ids); batches are refused."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise APIError(400, f"one prompt per request is supported, got {len(prompt)}", param="prompt",
                           code="unsupported_value")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, None
    bad = next((t for t in prompt if t >= vocab_size), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is outside the vocabulary (size {vocab_size})", param="prompt",
                       code="invalid_value")
    return None, list(prompt)


def _finish_reason(done: Finished) -> str | None:
    reason = done.result.finish_reason
    return reason if reason in ("stop", "length") else None


def _sse(chunk: Any, include_usage: bool) -> str:
    data = chunk.model_dump(mode="json")
    for choice in data["choices"]:
        if "delta" in choice:  # OpenAI leaves unset delta fields out: {"content": "x"}, {}
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
    if not include_usage:
        data.pop("usage")
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _sse_error(event: Failed, count: Callable[[APIError], None]) -> str:
    error = _failure(event)
    count(error)
    return f"data: {json.dumps(error.body())}\n\n"


def _failure(event: Failed) -> APIError:
    if isinstance(event.error, JobCancelled):
        return APIError(503, "the server is shutting down", type="server_error", code="unavailable")
    return APIError(500, f"generation failed: {event.error}", type="server_error")


def _event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _job_events(job: Job, request: Request) -> AsyncIterator[Piece | Finished | Failed]:
    """The job's events until the last; a client that disconnects cancels the job.

    NOTE: one pending get is kept across polls (rather than wait_for, which can drop an
    item when the timeout and the put race); the disconnect check runs every
    DISCONNECT_POLL_S whether or not events arrive.
    """
    getter: asyncio.Future | None = None
    finished = False
    next_check = time.monotonic() + DISCONNECT_POLL_S
    try:
        while True:
            if getter is None:
                getter = asyncio.ensure_future(job.next_event())
            done, _ = await asyncio.wait({getter}, timeout=max(0.0, next_check - time.monotonic()))
            if time.monotonic() >= next_check:  # also while pieces keep coming (non-streaming)
                if await request.is_disconnected():
                    return
                next_check = time.monotonic() + DISCONNECT_POLL_S
            if not done:
                continue
            event, getter = getter.result(), None
            finished = not isinstance(event, Piece)
            yield event
            if finished:
                return
    finally:
        if getter is not None:
            getter.cancel()
        if not finished:  # the client went away (or the stream was closed under us)
            job.cancel("client disconnected")


async def _collect(job: Job, request: Request) -> tuple[str, Finished]:
    async for event in _job_events(job, request):
        if isinstance(event, Piece):
            continue  # the result holds the whole text
        if isinstance(event, Finished):
            if event.result.finish_reason == "cancelled":
                raise APIError(503, "the generation was cancelled (server shutting down)", type="server_error",
                               code="unavailable")
            return event.result.text, event
        else:
            raise _failure(event)
    # Only reached when the client disconnected; nobody reads this reply.
    raise APIError(400, "client disconnected", code="client_disconnected")
