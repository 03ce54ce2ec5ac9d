"""Ollama's REST API beside the OpenAI routes: /api/chat and /api/generate (NDJSON streams by
default), /api/tags, /api/show, /api/ps, /api/version, /api/pull, and `/`, which Ollama's CLI
probes. A request becomes a Job on the same Serving queue as /v1's, under the same API keys,
tenant isolation, queue bound and body limits; errors answer in Ollama's shape, {"error": "..."}
with its statuses, so Ollama's clients raise their own ResponseError.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from draftwise.constraints import Constraint, llguidance_tokenizer
from draftwise.errors import BackendError, ConfigError, ConstraintError, PromptTooLongError
from draftwise.models import REGISTRY
from draftwise.server import ollama_answers as a
from draftwise.server import ollama_protocol as o
from draftwise.server import ollama_requests as r
from draftwise.server.app import _failure, _job_events, _speculation, _usage
from draftwise.server.errors import APIError
from draftwise.server.serving import Failed, Finished, Job, Piece, ServerBusy
from draftwise.server.tools import ChatTools

NDJSON = "application/x-ndjson"
_ERRORS = {status: {"model": o.ErrorResponse} for status in (400, 401, 404, 413, 500, 503)}


class OllamaErrors:
    """ASGI middleware for the /api/ paths: an error (answered by a route, the body checks or the
    API-key guard, all in OpenAI's shape) is rewritten as Ollama's {"error": "message"}, status
    unchanged; and a body is read as JSON whatever its Content-Type, as Ollama reads it (the
    `curl -d` of Ollama's docs sends application/x-www-form-urlencoded)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        held: dict | None = None
        body = b""

        async def rewriting_send(message) -> None:
            nonlocal held, body
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held = message
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            body += message.get("body", b"")
            if message.get("more_body", False):
                return
            new = _ollama_error(body)
            headers = [(k, v) for k, v in held.get("headers", []) if k.lower() != b"content-length"]
            await send({**held, "headers": [*headers, (b"content-length", str(len(new)).encode())]})
            await send({"type": "http.response.body", "body": new})

        await self.app(scope, receive, rewriting_send)


def _ollama_error(body: bytes) -> bytes:
    """OpenAI's {"error": {"message": ...}} -> {"error": "..."}; any other body is kept."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return json.dumps({"error": error["message"]}, ensure_ascii=False).encode()
    return body


def install(app: FastAPI, model_name: str) -> None:
    """Add Ollama's routes to an app made by create_app (its Serving is app.state.serving)."""
    serving = app.state.serving
    engine = serving.engine
    tokenizer = engine.tokenizer
    n_ctx = engine.target.n_ctx
    served = a.ServedModel(engine, model_name, time.time())
    app.add_middleware(OllamaErrors)

    def count(error: APIError) -> None:
        serving.metrics.observe_error(error.status, error.type)

    async def start(
        body: o.ChatRequest | o.GenerateRequest,
        request: Request,
        endpoint: str,
        encode: Callable[[], list[int]],
        options: r.Options,
        constraint: Constraint | None,
    ) -> Job:
        """Tokenise (worker thread), size the answer and queue one Job; library errors become 4xx."""
        logprobs = r.logprobs_asked(body)

        def prepare() -> tuple[list[int], object]:
            prompt_ids = encode()
            if constraint is not None:  # the model's tokenizer adapter, built once
                llguidance_tokenizer(engine.target)
            limit = r.answer_budget(options, len(prompt_ids), n_ctx)
            return prompt_ids, r.sampling(options, limit, constraint, logprobs)

        param = "messages" if isinstance(body, o.ChatRequest) else "prompt"
        try:
            prompt_ids, sampling = await asyncio.to_thread(prepare)
            speculation, drafters = _speculation(body, engine.speculation)
            job = Job(
                f"ollama-{uuid.uuid4().hex[:24]}",
                endpoint,
                prompt_ids,
                tenant=request.scope.get("state", {}).get("tenant"),
            )
            return await asyncio.to_thread(serving.submit, job, sampling, speculation, drafters)
        except UnicodeEncodeError as exc:
            raise APIError(
                400, f"the request holds U+{ord(exc.object[exc.start]):04X}, a lone surrogate", param=param
            ) from None
        except PromptTooLongError as exc:
            raise APIError(400, str(exc), param=param, code="context_length_exceeded") from None
        except ServerBusy as exc:
            raise APIError(503, str(exc), type="server_error", code="overloaded") from None
        except ConstraintError as exc:
            raise APIError(400, f"format: {exc}", param="format", code="invalid_value") from None
        except ConfigError as exc:
            raise APIError(400, str(exc), code="invalid_value") from None
        except BackendError as exc:
            raise APIError(400, str(exc), param=param, code="invalid_prompt") from None
        except Exception as exc:
            if type(exc).__module__.startswith("jinja2"):  # a chat template's raise_exception()
                raise APIError(400, f"the chat template rejected the messages: {exc}", param=param) from None
            raise

    def speculative(done: Finished) -> dict:
        return _usage(done).speculative.model_dump()

    async def collect(job: Job, request: Request) -> Finished:
        async for event in _job_events(job, request):
            if isinstance(event, Failed):
                raise _failure(event, "format")
            if isinstance(event, Finished):
                if event.result.finish_reason == "cancelled":
                    raise APIError(503, "the generation was cancelled (server shutting down)", type="server_error")
                return event
        raise APIError(400, "client disconnected", code="client_disconnected")  # nobody reads it

    def ndjson(lines: AsyncIterator[str]) -> StreamingResponse:
        return StreamingResponse(lines, media_type=NDJSON, headers={"Cache-Control": "no-cache"})

    async def streamed(
        job: Job,
        request: Request,
        piece: Callable[[Piece], list[dict]],
        last: Callable[[Finished], list[dict]],
    ) -> AsyncIterator[str]:
        """The job's chunks as NDJSON lines: piece() per text piece, last() at the end; a failure
        is an error line (Ollama's clients raise it)."""
        async for event in _job_events(job, request):
            if isinstance(event, Piece):
                for chunk in piece(event):
                    yield a.line(chunk)
            elif isinstance(event, Finished) and event.result.finish_reason != "cancelled":
                for chunk in last(event):
                    yield a.line(chunk)
            else:
                error = (
                    _failure(event, "format")
                    if isinstance(event, Failed)
                    else APIError(503, "the generation was cancelled (server shutting down)", type="server_error")
                )
                count(error)
                yield a.error_line(error.message)

    def one_line(obj: dict, stream: bool):
        if not stream:
            return JSONResponse(obj)

        async def lines() -> AsyncIterator[str]:
            yield a.line(obj)

        return ndjson(lines())

    @app.post("/api/chat", tags=["ollama"], responses=_ERRORS)
    async def chat(body: o.ChatRequest, request: Request):
        started = time.monotonic()
        r.check_model(body.model, model_name)
        r.refuse_unsupported(body)
        if not body.messages:  # Ollama's way to load a model
            return one_line(a.loaded(body.model, chat=True), body.streamed)
        options = r.parse_options(body.options, n_ctx)
        constraint = r.format_constraint(body.format)
        tools, messages = r.chat_tools(body.tools, tokenizer, r.chat_messages(body.messages), constraint is not None)
        job = await start(
            body,
            request,
            "ollama_chat",
            lambda: serving.encode(None, messages, tools.rendered if tools else None),
            options,
            tools.plan.constraint if tools else constraint,
        )
        if not body.streamed:
            done = await collect(job, request)
            content, calls = _whole_answer(tools, done.result.text)
            chunk = a.chat_chunk(body.model, content, calls, a.logprobs(tokenizer, done.result.logprobs or ()))
            return JSONResponse(a.finished(chunk, done, started, speculative(done)))
        sent = []  # the content streamed so far

        def content(events) -> list[dict]:
            texts = [e.content for e in events if e.content]
            sent.extend(texts)
            return [a.chat_chunk(body.model, text) for text in texts]

        def piece(event: Piece) -> list[dict]:
            if tools is None:
                return [a.chat_chunk(body.model, event.text, logprobs=a.logprobs(tokenizer, event.logprobs))]
            return content(tools.feed(0, event.text))  # calls come whole, at the end

        def last(done: Finished) -> list[dict]:
            out = [] if tools is None else content(tools.finish(0)[0])
            if tools is not None:
                # The calls as the whole answer holds them; an answer cut inside a call (num_predict)
                # has none, and its held-back text is content, as in the answer not streamed.
                text, calls = _whole_answer(tools, done.result.text)
                so_far = "".join(sent)
                if calls:
                    out.append(a.chat_chunk(body.model, "", calls))
                elif text.startswith(so_far) and len(text) > len(so_far):
                    out.append(a.chat_chunk(body.model, text[len(so_far) :]))
            return [*out, a.finished(a.chat_chunk(body.model), done, started, speculative(done))]

        return ndjson(streamed(job, request, piece, last))

    @app.post("/api/generate", tags=["ollama"], responses=_ERRORS)
    async def generate(body: o.GenerateRequest, request: Request):
        started = time.monotonic()
        r.check_model(body.model, model_name)
        r.refuse_unsupported(body)
        prompt = body.prompt or ""
        if not prompt and not body.suffix:  # Ollama's way to load (keep_alive 0: unload) a model
            return one_line(a.loaded(body.model, chat=False), body.streamed)
        options = r.parse_options(body.options, n_ctx)
        constraint = r.format_constraint(body.format)
        if body.suffix:  # fill in the middle: the prompt is the text before the gap
            encode = lambda: r.fim_ids(tokenizer, prompt, body.suffix)  # noqa: E731
        elif body.raw:
            encode = lambda: serving.encode(prompt)  # noqa: E731
        else:
            messages = r.generate_messages(body)
            encode = lambda: serving.encode(None, messages)  # noqa: E731
        job = await start(body, request, "ollama_generate", encode, options, constraint)
        if not body.streamed:
            done = await collect(job, request)
            logprobs = a.logprobs(tokenizer, done.result.logprobs or ())
            chunk = a.generate_chunk(body.model, done.result.text, logprobs)
            return JSONResponse(a.finished(chunk, done, started, speculative(done)))

        def piece(event: Piece) -> list[dict]:
            return [a.generate_chunk(body.model, event.text, a.logprobs(tokenizer, event.logprobs))]

        def last(done: Finished) -> list[dict]:
            return [a.finished(a.generate_chunk(body.model), done, started, speculative(done))]

        return ndjson(streamed(job, request, piece, last))

    @app.get("/api/tags", tags=["ollama"], responses=_ERRORS)
    async def tags() -> dict:
        return {"models": [served.listed().model_dump()]}

    @app.get("/api/ps", tags=["ollama"], responses=_ERRORS)
    async def ps() -> dict:
        return {"models": [served.running().model_dump()]}

    @app.post("/api/show", response_model=o.ShowResponse, tags=["ollama"], responses=_ERRORS)
    async def show(body: o.ShowRequest) -> o.ShowResponse:
        r.check_model(body.model or body.name, model_name)
        return served.show()

    @app.get("/api/version", response_model=o.Version, tags=["ollama"])
    async def version() -> o.Version:
        return o.Version(version=a.OLLAMA_VERSION)

    @app.post("/api/pull", tags=["ollama"], responses=_ERRORS)
    async def pull(body: o.PullRequest):
        name = body.model or body.name or ""
        if r.base_name(name) != r.base_name(model_name):
            known = r.base_name(name) in REGISTRY
            raise APIError(
                400 if known else 404,
                f"this server serves '{r.tagged(model_name)}' only; draftwise fetches its own models with "
                f"`draftwise pull {r.base_name(name) if known else 'NAME'}` and serves one with "
                f"`draftwise serve --target NAME` (known models: {', '.join(REGISTRY)})",
                param="model",
                code="model_not_found",
            )
        digest = f"sha256:{served.digest}"
        statuses = [
            {"status": "pulling manifest"},
            {
                "status": f"pulling {served.digest[:12]}",
                "digest": digest,
                "total": served.size,
                "completed": served.size,
            },
            {"status": "verifying sha256 digest"},
            {"status": "writing manifest"},
            {"status": "success"},
        ]
        if body.stream is False:
            return JSONResponse({"status": "success"})

        async def lines() -> AsyncIterator[str]:
            for status in statuses:
                yield a.line(status)

        return ndjson(lines())

    @app.api_route("/", methods=["GET", "HEAD"], response_class=PlainTextResponse, tags=["ollama"])
    async def running() -> str:
        return "Ollama is running"  # the text Ollama's CLI and clients check for


def _whole_answer(tools: ChatTools | None, text: str) -> tuple[str, list[dict] | None]:
    """A whole answer's content and its calls in Ollama's shape (None without calls)."""
    parsed = tools.parse(text) if tools is not None else None
    if parsed is None or not parsed.calls:
        return text, None
    return parsed.content or "", [a.ollama_call(call, i) for i, call in enumerate(parsed.calls)]
