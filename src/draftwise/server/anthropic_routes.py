"""Anthropic's Messages routes beside the OpenAI ones: /v1/messages (one message, or server-sent
events when `stream` is true) and /v1/messages/count_tokens; `AnthropicErrors`, the middleware
that takes Anthropic's `x-api-key` header and answers their errors in Anthropic's shape.

A request is translated (anthropic_translate.py) and becomes a Job on the same Serving queue as
/v1/chat/completions', under the same API keys, tenant isolation, queue bound and body limits,
decoding tools under the same grammar and drafters; its answer (anthropic_answers.py) goes back
through streams.messages_reply. See docs/messages.md for Claude Code against this server.
"""

from __future__ import annotations

import asyncio
import json
import uuid

from fastapi import APIRouter, Request

from draftwise.server import anthropic_answers as a
from draftwise.server import anthropic_protocol as m
from draftwise.server import anthropic_translate as t
from draftwise.server.errors import MODEL_UNAVAILABLE, openai_refusal, rewrite_errors
from draftwise.server.serving import Job
from draftwise.server.state import State, Tenant
from draftwise.server.streams import messages_reply
from draftwise.server.translate import refusals

_ERRORS = {status: {"model": m.ErrorResponse} for status in (400, 401, 403, 404, 413, 415, 500, 503, 529)}
_STREAM_RESPONSE = {
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
    "description": "A message, or Anthropic's server-sent events when `stream` is true.",
}

router = APIRouter()


@router.post("/v1/messages", tags=["anthropic"], responses={200: _STREAM_RESPONSE, **_ERRORS})
async def messages(body: m.MessagesRequest, request: Request, state: State, tenant: Tenant):
    engine = state.engine
    prepared = await asyncio.to_thread(t.translate, engine, body, (state.model_name, state.names))
    [one], reply = prepared.requests, prepared.reply
    with refusals("messages", reply.constraint_param):
        job = Job(f"msg_{uuid.uuid4().hex[:24]}", "messages", one.prompt_ids, tenant=tenant)
        await asyncio.to_thread(state.serving.submit, job, one.sampling, one.speculation, one.drafters)
    answer = a.MessagesAnswer(job, state.model_name, engine.tokenizer, prepared.tools, reply.stop)
    return await messages_reply(job, reply, request, answer, metrics=state.metrics)


@router.post("/v1/messages/count_tokens", response_model=m.TokenCount, tags=["anthropic"], responses=_ERRORS)
async def count_tokens(body: m.CountTokensRequest, state: State) -> m.TokenCount:
    """The prompt's tokens as /v1/messages would lay it out (the chat template, tools included)."""
    engine = state.engine
    t.check_model(body.model, state.model_name, state.names)
    t.refuse_unsupported(body)
    tools, chat = t.chat_tools(body, engine.tokenizer, t.chat_messages(body))
    try:
        ids = await asyncio.to_thread(t.prompt_ids, engine, chat, tools)
    except Exception as exc:
        error = openai_refusal(exc, param="messages", constraint_param="tools")
        if error is None:
            raise
        raise error from None
    return m.TokenCount(input_tokens=len(ids))


# ---------------------------------------------------------------------- keys and errors in Anthropic's shape
class AnthropicErrors:
    """ASGI middleware for the /v1/messages paths: Anthropic's `x-api-key: KEY` header is read as
    the bearer key the Guard checks (a request that has both is judged by its Authorization), and
    an error (answered by a route, the body checks or the Guard, all in OpenAI's shape) is
    rewritten as Anthropic's {"type": "error", "error": {"type", "message"}}, with its status
    (503 becomes 529, but for a model that cannot load: 500). It wraps the Guard, so create_app
    adds it after errors.install."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/messages"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if b"authorization" not in headers and b"x-api-key" in headers:
            bearer = (b"authorization", b"Bearer " + headers[b"x-api-key"])
            scope = {**scope, "headers": [*scope["headers"], bearer]}
        await rewrite_errors(self.app, scope, receive, send, _anthropic_error)


def _anthropic_error(status: int, body: bytes) -> tuple[int, bytes]:
    """OpenAI's {"error": {"message": ..., "param": ...}} -> Anthropic's error, the message led by
    the field it names unless it says it already (Anthropic's messages name the field first:
    "max_tokens: Field required"); any other body is kept."""
    try:
        data = json.loads(body)
    except ValueError:
        return status, body
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return status, body
    message, param = error["message"], error.get("param")
    if isinstance(param, str) and param not in message:
        message = f"{param}: {message}"
    if error.get("code") == MODEL_UNAVAILABLE:  # not 529 overloaded_error, which clients retry without end
        status = 500
    status, out = a.error(status, message)
    return status, json.dumps(out, ensure_ascii=False).encode()
