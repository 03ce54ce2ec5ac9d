"""Ollama's routes beside the OpenAI ones: /api/chat and /api/generate (NDJSON streams by
default), /api/tags, /api/show, /api/ps, /api/version, /api/pull; `OllamaErrors`, the middleware
that answers their errors in Ollama's shape. `/`, which Ollama's CLI probes, is page_routes.py's:
"Ollama is running", except to a browser, which gets the chat page.

A request is translated (ollama_translate.py) and becomes a Job on the same Serving queue as
/v1's, under the same API keys, tenant isolation, queue bound and body limits; its answer
(ollama_answers.py) goes back through streams.ollama_reply. Errors are {"error": "..."} with
Ollama's statuses, so Ollama's clients raise their own ResponseError.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from draftwise.models import REGISTRY
from draftwise.server import names, pool_answers
from draftwise.server import ollama_answers as a
from draftwise.server import ollama_protocol as o
from draftwise.server import ollama_translate as t
from draftwise.server.errors import APIError, rewrite_errors
from draftwise.server.ollama_translate import OllamaReply
from draftwise.server.prepared import Prepared
from draftwise.server.serving import Job
from draftwise.server.state import Pool, State, Tenant, server_state
from draftwise.server.streams import ndjson_response, ollama_reply
from draftwise.server.translate import refusals

_ERRORS = {status: {"model": o.ErrorResponse} for status in (400, 401, 403, 404, 413, 415, 500, 503)}
_STREAM_RESPONSE = {
    "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
    "description": "NDJSON (one object per line) unless `stream` is false: then one object.",
}

router = APIRouter()


async def submit(state: State, prepared: Prepared[OllamaReply], tenant: int | None, endpoint: str) -> Job:
    """Queue a translated request as one Job; library errors become the 4xx APIErrors of
    errors.openai_refusal, which OllamaErrors words as Ollama's."""
    [request], reply = prepared.requests, prepared.reply
    with refusals(reply.prompt_param, reply.constraint_param):
        job = Job(f"ollama-{uuid.uuid4().hex[:24]}", endpoint, request.prompt_ids, tenant=tenant)
        return await asyncio.to_thread(
            state.serving.submit, job, request.sampling, request.speculation, request.drafters
        )


def unload_answer(path: str, data: object):
    """The answer to Ollama's unload request (keep_alive 0, no prompt or messages: what `ollama
    stop` sends) for a model that is not loaded, given without loading it (model_router.py asks
    with a body its route's schema accepted); None for any other request."""
    if not isinstance(data, dict) or path not in ("/api/generate", "/api/chat"):
        return None
    chat = path == "/api/chat"
    if (data.get("messages") if chat else (data.get("prompt") or data.get("suffix"))) or not data.get("model"):
        return None
    return _one(a.loaded(data["model"], chat=chat, reason="unload"), data.get("stream") is not False)


def _one(obj: dict, stream: bool):
    """A reply of one object: alone, or as a stream of one line."""
    if not stream:
        return JSONResponse(obj)

    async def lines() -> AsyncIterator[str]:
        yield a.line(obj)

    return ndjson_response(lines())


@router.post("/api/chat", tags=["ollama"], responses={200: _STREAM_RESPONSE, **_ERRORS})
async def chat(body: o.ChatRequest, request: Request, state: State, tenant: Tenant):
    started = time.monotonic()
    engine = state.engine
    prepared = await asyncio.to_thread(t.chat, engine, body, (state.model_name, state.names))
    reply = prepared.reply
    if not prepared.requests:  # Ollama's way to load (keep_alive 0: unload) a model
        return _one(a.loaded(reply.model, chat=True, reason=reply.load_reason), reply.stream)
    job = await submit(state, prepared, tenant, "ollama_chat")
    answer = a.ChatAnswer(reply.model, engine.tokenizer, started, prepared.tools)
    return await ollama_reply(job, reply, request, answer, metrics=state.metrics)


@router.post("/api/generate", tags=["ollama"], responses={200: _STREAM_RESPONSE, **_ERRORS})
async def generate(body: o.GenerateRequest, request: Request, state: State, tenant: Tenant):
    started = time.monotonic()
    engine = state.engine
    prepared = await asyncio.to_thread(t.generate, engine, body, (state.model_name, state.names))
    reply = prepared.reply
    if not prepared.requests:  # Ollama's way to load (keep_alive 0: unload) a model
        return _one(a.loaded(reply.model, chat=False, reason=reply.load_reason), reply.stream)
    job = await submit(state, prepared, tenant, "ollama_generate")
    answer = a.GenerateAnswer(reply.model, engine.tokenizer, started)
    return await ollama_reply(job, reply, request, answer, metrics=state.metrics)


@router.get("/api/tags", tags=["ollama"], responses=_ERRORS)
async def tags(request: Request, pool: Pool) -> dict:
    if pool is not None:
        return pool_answers.ollama_tags(pool, pool.created)
    return {"models": [a.listed(server_state(request)).model_dump()]}


@router.get("/api/ps", tags=["ollama"], responses=_ERRORS)
async def ps(request: Request, pool: Pool) -> dict:
    if pool is not None:
        return pool_answers.ollama_ps(pool)
    return {"models": [a.running(server_state(request)).model_dump()]}


@router.post("/api/show", response_model=o.ShowResponse, tags=["ollama"], responses=_ERRORS)
async def show(body: o.ShowRequest, request: Request, pool: Pool) -> o.ShowResponse:
    if pool is not None:  # a server of several models: told from its file, loaded or not, the same
        served = pool.resolve(body.model or body.name)
        if served is None:
            listed = names.listing(o.tagged(s.name) for s in pool.sources)
            raise APIError(
                404,
                f"model {names.quoted(body.model or body.name)} not found; this server serves {listed}",
                param="model",
            )
        return pool_answers.ollama_show(pool, served)
    state = server_state(request)
    t.check_model(body.model or body.name, state.model_name, state.names)
    return a.show(state)


@router.get("/api/version", response_model=o.Version, tags=["ollama"], responses=_ERRORS)
async def version() -> o.Version:
    return o.Version(version=a.OLLAMA_VERSION)


@router.post("/api/pull", tags=["ollama"], responses={200: _STREAM_RESPONSE, **_ERRORS})
async def pull(body: o.PullRequest, state: State):
    """The served model is there already; draftwise fetches any other with `draftwise pull`."""
    name = o.base_name(body.model or body.name or "")
    if name != o.base_name(state.model_name):
        known = name in REGISTRY
        raise APIError(
            400 if known else 404,
            f"this server serves '{o.tagged(state.model_name)}' only; draftwise fetches its own models with "
            f"`draftwise pull {name if known else 'NAME'}` and serves one with `draftwise serve --target NAME` "
            f"(known models: {', '.join(REGISTRY)})",
            param="model",
            code="model_not_found",
        )
    if body.stream is False:
        return JSONResponse({"status": "success"})

    async def lines() -> AsyncIterator[str]:
        for status in a.pull_statuses(state):
            yield a.line(status)

    return ndjson_response(lines())


# ---------------------------------------------------------------------- errors in Ollama's shape
class OllamaErrors:
    """ASGI middleware for the /api/ paths: an error (answered by a route, the body checks, the
    API-key guard or the access guard, all in OpenAI's shape) is rewritten as Ollama's
    {"error": "message"}, status unchanged. It wraps the guards, so create_app adds it after them.
    (The `curl -d` of Ollama's docs sends application/x-www-form-urlencoded: access.AccessGuard
    reads such a body as JSON when no browser sent it.)"""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return
        await rewrite_errors(self.app, scope, receive, send, lambda status, body: (status, _ollama_error(body)))


def _ollama_error(body: bytes) -> bytes:
    """OpenAI's {"error": {"message": ..., "param": ...}} -> {"error": "..."}, the message led by
    the field it names unless it says it already (Ollama's errors have no field of their own);
    any other body is kept. Example: message "invalid json schema", param "format" -> "format:
    invalid json schema"."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return body
    message, param = error["message"], error.get("param")
    if isinstance(param, str) and param not in message:
        message = f"{param}: {message}"
    return json.dumps({"error": message}, ensure_ascii=False).encode()
