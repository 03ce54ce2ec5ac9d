"""OpenAI's routes: /v1/chat/completions, /v1/completions (JSON, or server-sent events in
OpenAI's chunk format), /v1/models; and the server's /health and /metrics.

Each route translates its body once (translate.py: the engine's requests and an OpenAIReply),
queues one Job per choice on the Serving queue (`submit`), and replies with its answer
(answers.py) through streams.py, which read the reply, not the body; a client that goes away
cancels its jobs, which the engine sees at its next step.
"""

from __future__ import annotations

import asyncio
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response

from draftwise.server import names, pool_answers, translate
from draftwise.server import protocol as p
from draftwise.server.answers import ChatAnswer, CompletionAnswer
from draftwise.server.errors import ERROR_STATUSES, APIError
from draftwise.server.prepared import Prepared
from draftwise.server.serving import Job
from draftwise.server.state import Operator, Pool, ServerState, State, Tenant, server_state
from draftwise.server.streams import openai_reply
from draftwise.server.translate import OpenAIReply

_STREAM_RESPONSE = {
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
    "description": "JSON, or server-sent events when `stream` is true.",
}

router = APIRouter()


async def submit(
    state: State, prepared: Prepared[OpenAIReply], tenant: int | None, endpoint: str, prefix: str
) -> list[Job]:
    """Queue a translated request, one Job per choice (prompt-major: each prompt's best_of
    copies, see server.choices); library errors become the 4xx APIErrors of
    errors.openai_refusal (then no job stays queued). best_of > n (completions): each
    candidate's logprobs are kept for ranking."""
    reply = prepared.reply
    job_id, jobs = f"{prefix}-{uuid.uuid4().hex[:24]}", []
    ranked = reply.best_of > reply.n
    with translate.refusals(reply.prompt_param, reply.constraint_param):
        try:
            for request in prepared.requests:
                for copy in range(reply.best_of):
                    one = request.choice(copy, ranked=ranked)
                    job = Job(job_id, endpoint, one.prompt_ids, tenant=tenant, predicted=one.prediction is not None)
                    await asyncio.to_thread(
                        state.serving.submit,
                        job,
                        one.sampling,
                        one.speculation,
                        one.drafters,
                        one.prediction,
                        one.token_sources,
                    )
                    jobs.append(job)
        except BaseException:
            for job in jobs:
                job.cancel("another choice of the request was refused")
            raise
    return jobs


def capacity(state: ServerState) -> int:
    """The choices the server can hold at once: its queue and its slots."""
    return state.serving.max_queue + state.engine.num_slots


@router.post(
    "/v1/chat/completions",
    response_model=p.ChatCompletion,
    tags=["openai"],
    responses={200: _STREAM_RESPONSE, **ERROR_STATUSES},
)
async def chat_completions(body: p.ChatCompletionRequest, request: Request, state: State, tenant: Tenant):
    """NOTE: the translation tokenises and compiles (the prompt, the prediction, the constraint),
    so it runs in a worker thread: no request holds the event loop, and with it every other
    client and /health."""
    engine, served = state.engine, (state.model_name, state.names)
    prepared = await asyncio.to_thread(translate.chat, engine, body, served, capacity(state))
    jobs = await submit(state, prepared, tenant, "chat", "chatcmpl")
    answer = ChatAnswer(prepared.reply, jobs, state.model_name, engine.tokenizer, prepared.tools)
    return await openai_reply(jobs, prepared.reply, request, answer, metrics=state.metrics)


@router.post(
    "/v1/completions",
    response_model=p.Completion,
    tags=["openai"],
    responses={200: _STREAM_RESPONSE, **ERROR_STATUSES},
)
async def completions(body: p.CompletionRequest, request: Request, state: State, tenant: Tenant):
    engine, served = state.engine, (state.model_name, state.names)
    prepared = await asyncio.to_thread(translate.completions, engine, body, served, capacity(state))
    jobs = await submit(state, prepared, tenant, "completions", "cmpl")
    answer = CompletionAnswer(prepared.reply, jobs, state.model_name, engine.tokenizer)
    return await openai_reply(jobs, prepared.reply, request, answer, metrics=state.metrics)


@router.get("/v1/models", response_model=p.ModelList, tags=["openai"], responses=ERROR_STATUSES)
async def list_models(request: Request, pool: Pool) -> p.ModelList:
    if pool is not None:
        return pool_answers.model_cards(pool, pool.created)
    return p.ModelList(data=[_card(server_state(request))])


def _card(state: ServerState) -> p.ModelCard:
    aliases = [*names.spellings(state.model_name), *sorted(state.names)]
    return p.ModelCard(id=state.model_name, created=state.created, aliases=aliases)


@router.get("/v1/models/{model_id:path}", response_model=p.ModelCard, tags=["openai"], responses=ERROR_STATUSES)
async def get_model(model_id: str, request: Request, pool: Pool) -> p.ModelCard:
    """The model of any of its names (server/names.py), as /v1/models lists it."""
    if pool is not None:
        served = pool.resolve(model_id) if model_id else None
        if served is not None:
            return pool_answers.model_card(pool, served)
    elif server_state(request).answers_to(model_id):
        return _card(server_state(request))
    raise APIError(404, f"the model {names.quoted(model_id)} does not exist", param="model", code="model_not_found")


@router.get(
    "/health",
    response_model=p.Health,
    response_model_exclude_none=True,
    description="Whether the server is up; its model, slots and queue too for the operator (on a "
    "server without keys, everyone; else the holder of the metrics key, or of the one API key).",
)
async def health(request: Request, operator: Operator, pool: Pool) -> p.Health:
    if not operator:  # the queue and the busy slots tell of other tenants' requests
        return p.Health()
    if pool is not None:
        return pool_answers.health(pool)
    state = server_state(request)
    serving = state.serving
    return p.Health(
        model=state.model_name,
        queue_length=serving.queue_length,
        running=bool(serving.running),
        slots=state.engine.num_slots,
        active=len(serving.running),
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}, **{s: ERROR_STATUSES[s] for s in (401, 403)}},
    description="Prometheus text format, every tenant's requests together: with several API keys "
    "it answers the metrics key only.",
)
async def prometheus(request: Request, pool: Pool) -> Response:
    metrics = request.app.state.metrics
    body = pool_answers.render_metrics(metrics, pool) if pool is not None else metrics.render()
    return Response(body, headers={"Content-Type": metrics.content_type})
