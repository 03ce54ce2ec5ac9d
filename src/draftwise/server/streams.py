"""A job's events on the event loop, and the reply that carries an answer to the client.

`job_events` yields a job's events up to its last and cancels the job when the client goes
away; `openai_reply` answers a /v1 request's jobs as one JSON object or as server-sent events
in OpenAI's chunk format (`sse_response` is the streaming reply of the protocols that use
server-sent events); `ollama_reply` answers an /api/chat or /api/generate job as one object or
as Ollama's NDJSON stream (`ndjson_response`); `messages_reply` answers a /v1/messages job as
one message or as Anthropic's server-sent events; `responses_reply` a /v1/responses job as the
response object or its server-sent events.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from draftwise.server import answers, anthropic_answers, choices, ollama_answers, responses_answers
from draftwise.server.errors import APIError
from draftwise.server.metrics import ServerMetrics
from draftwise.server.prepared import Reply
from draftwise.server.serving import Finished, Job, JobFailed, Piece
from draftwise.server.translate import OpenAIReply

DISCONNECT_POLL_S = 0.25


async def job_events(job: Job, request: Request) -> AsyncIterator[Piece | Finished | JobFailed]:
    """The job's events up to the last one; a client that disconnects cancels the job.

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
        if not finished:  # the client went away, or the stream was closed under us
            job.cancel("client disconnected")


async def collect(job: Job, request: Request, constraint_param: str | None = None) -> Finished:
    """The job's result; a failure or a cancellation by the server is raised as its APIError."""
    async for event in job_events(job, request):
        if isinstance(event, Finished):
            if event.result.finish_reason == "cancelled":
                raise APIError(
                    503, "the generation was cancelled (server shutting down)", type="server_error", code="unavailable"
                )
            return event
        if isinstance(event, JobFailed):
            raise answers.failure(event, constraint_param)
    # Only reached when the client disconnected; nobody reads this reply.
    raise APIError(400, "client disconnected", code="client_disconnected")


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


async def openai_reply(
    jobs: list[Job], reply: OpenAIReply, request: Request, answer: answers.OpenAIAnswer, *, metrics: ServerMetrics
):
    """The choices' answers as one JSON reply, or their chunks as server-sent events (each
    chunk names its choice's index; usage, when asked, sums the choices at the end)."""
    constraint_param = reply.constraint_param
    if not reply.stream:
        done = await asyncio.gather(*(collect(job, request, constraint_param) for job in jobs))
        return answer.whole(list(done))
    include_usage = reply.include_usage

    async def events() -> AsyncIterator[str]:
        for opening in answer.openings():
            yield opening
        finished: dict[int, Finished] = {}  # by choice index
        async for i, event in choices.merged([job_events(job, request) for job in jobs]):
            if isinstance(event, Piece):
                yield answer.text_chunk(i, event)
            elif isinstance(event, Finished):
                finished[i] = event
                yield answer.final_chunk(i, event)
                if include_usage and len(finished) == len(jobs):
                    yield answer.usage_chunk(answers.usage([finished[k] for k in sorted(finished)], reply.n))
            else:
                error = answers.failure(event, constraint_param)
                metrics.observe_error(error.status, error.type)
                yield f"data: {json.dumps(error.body())}\n\n"
        yield "data: [DONE]\n\n"

    return sse_response(events())


def ndjson_response(lines: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        lines, media_type="application/x-ndjson", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


async def ollama_reply(
    job: Job, reply: Reply, request: Request, answer: ollama_answers.OllamaAnswer, *, metrics: ServerMetrics
):
    """The answer as one JSON object, or its chunks as NDJSON lines; a failure after the stream
    began is an {"error": ...} line, which Ollama's clients raise as their ResponseError."""
    constraint_param = reply.constraint_param
    if not reply.stream:
        return JSONResponse(answer.whole(await collect(job, request, constraint_param)))

    async def lines() -> AsyncIterator[str]:
        async for event in job_events(job, request):
            if isinstance(event, Piece):
                chunks = answer.piece(event)
            elif isinstance(event, Finished) and event.result.finish_reason != "cancelled":
                chunks = answer.last(event)
            else:
                error = (
                    answers.failure(event, constraint_param)
                    if isinstance(event, JobFailed)
                    else APIError(503, "the generation was cancelled (server shutting down)", type="server_error")
                )
                metrics.observe_error(error.status, error.type)
                chunks = [{"error": error.message}]
            for chunk in chunks:
                yield ollama_answers.line(chunk)

    return ndjson_response(lines())


async def messages_reply(
    job: Job, reply: Reply, request: Request, answer: anthropic_answers.MessagesAnswer, *, metrics: ServerMetrics
):
    """The answer as one message, or as Anthropic's events; a failure after the stream began is
    an `error` event, which Anthropic's clients raise as their APIStatusError."""
    constraint_param = reply.constraint_param
    if not reply.stream:
        return JSONResponse(answer.whole(await collect(job, request, constraint_param)))

    async def events() -> AsyncIterator[str]:
        yield answer.opening()
        async for event in job_events(job, request):
            if isinstance(event, Piece):
                yield answer.piece(event)
            elif isinstance(event, Finished) and event.result.finish_reason != "cancelled":
                yield answer.last(event)
            else:
                error = (
                    answers.failure(event, constraint_param)
                    if isinstance(event, JobFailed)
                    else APIError(503, "the generation was cancelled (server shutting down)", type="server_error")
                )
                metrics.observe_error(error.status, error.type)
                yield anthropic_answers.event("error", anthropic_answers.error(error.status, error.message)[1])

    return sse_response(events())


async def responses_reply(
    job: Job,
    reply: Reply,
    request: Request,
    answer: responses_answers.ResponseAnswer,
    *,
    metrics: ServerMetrics,
    keep: Callable[[dict], None],
):
    """The response object, or its server-sent events (response.created ... response.completed);
    `keep` takes the finished object (the route stores it). A failure after the stream began is an
    error event and response.failed."""
    constraint_param = reply.constraint_param
    if not reply.stream:
        final = answer.whole(await collect(job, request, constraint_param))
        keep(final)
        return JSONResponse(final)

    async def events() -> AsyncIterator[str]:
        for opening in answer.openings():
            yield opening
        async for event in job_events(job, request):
            if isinstance(event, Piece):
                chunks = answer.piece(event)
            elif isinstance(event, Finished) and event.result.finish_reason != "cancelled":
                chunks, final = answer.last(event)
                keep(final)
            else:
                error = (
                    answers.failure(event, constraint_param)
                    if isinstance(event, JobFailed)
                    else APIError(503, "the generation was cancelled (server shutting down)", type="server_error")
                )
                metrics.observe_error(error.status, error.type)
                chunks = answer.failed(error.message, error.code, error.param)
            for chunk in chunks:
                yield chunk

    return sse_response(events())
