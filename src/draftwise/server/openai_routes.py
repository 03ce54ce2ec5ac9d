"""OpenAI's routes: /v1/chat/completions, /v1/completions (JSON, or server-sent events in
OpenAI's chunk format), /v1/models; and the server's /health and /metrics.

Each route translates its body (translate.py), queues one Job per choice on the Serving
queue (`submit`), and replies with its answer (answers.py) through streams.py; a client
that goes away cancels its jobs, which the engine sees at its next step.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from draftwise.server import choices, names, pool_answers, translate
from draftwise.server import protocol as p
from draftwise.server.answers import ChatAnswer, CompletionAnswer
from draftwise.server.errors import ERROR_STATUSES, APIError, openai_refusal
from draftwise.server.serving import Job
from draftwise.server.state import Operator, Pool, ServerState, State, Tenant, server_state
from draftwise.server.streams import openai_reply
from draftwise.server.tools import chat_tools

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint

_STREAM_RESPONSE = {
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
    "description": "JSON, or server-sent events when `stream` is true.",
}

router = APIRouter()


async def submit(
    state: State,
    body: p._GenerationRequest,
    tenant: int | None,
    endpoint: str,
    prefix: str,
    items: list[Any],
    prepare: Callable[[Any], translate.EngineRequest],
    *,
    param: str,
    copies: int | None = None,
) -> list[Job]:
    """Translate and queue a request, one Job per choice: each item (a prompt, or None for chat
    messages) `copies` times, default n (see server.choices); library errors become the 4xx
    APIErrors of errors.openai_refusal (then no job stays queued). copies > n (completions'
    best_of): each answer's logprobs are kept for ranking.

    NOTE: everything that grows with the request (tokenising the prompt and the prediction,
    compiling the constraint) runs in a worker thread, so that no request holds the event loop
    (and with it every other client and /health).
    """
    job_id, jobs = f"{prefix}-{uuid.uuid4().hex[:24]}", []
    per_prompt = copies or body.n or 1
    # More choices than the server can ever hold at once would meet a full queue (503) even on
    # an idle server: that request can never be served, so it is a 400 before anything is queued.
    capacity = state.serving.max_queue + state.engine.num_slots
    if len(items) * per_prompt > capacity:
        raise APIError(
            400,
            f"the request asks for {len(items) * per_prompt} choices ({len(items)} prompt(s) x {per_prompt}); "
            f"this server holds at most {capacity} at once (--max-queue plus its slots)",
            param="n",
            code="too_many_choices",
        )
    try:
        try:
            for item in items:
                prepared = await asyncio.to_thread(prepare, item)
                for copy in range(per_prompt):
                    one = prepared.choice(copy, ranked=per_prompt > (body.n or 1))
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
    except Exception as exc:
        error = openai_refusal(exc, param=param, constraint_param=translate.constraint_param(body))
        if error is None:
            raise
        raise error from None
    return jobs


@router.post(
    "/v1/chat/completions",
    response_model=p.ChatCompletion,
    tags=["openai"],
    responses={200: _STREAM_RESPONSE, **ERROR_STATUSES},
)
async def chat_completions(body: p.ChatCompletionRequest, request: Request, state: State, tenant: Tenant):
    engine = state.engine
    tools, messages = chat_tools(body, engine.tokenizer, translate.chat_messages(body))
    max_tokens = body.max_completion_tokens or body.max_tokens
    translate.check_model(body, state.model_name, state.names)

    def prepare(_item: None) -> translate.EngineRequest:
        return translate.openai_request(engine, body, None, messages, max_tokens, None, tools)

    jobs = await submit(state, body, tenant, "chat", "chatcmpl", [None], prepare, param="messages")
    answer = ChatAnswer(body, jobs, state.model_name, engine.tokenizer, tools)
    return await openai_reply(
        jobs, body, request, answer, constraint_param=translate.constraint_param(body), metrics=state.metrics
    )


@router.post(
    "/v1/completions",
    response_model=p.Completion,
    tags=["openai"],
    responses={200: _STREAM_RESPONSE, **ERROR_STATUSES},
)
async def completions(body: p.CompletionRequest, request: Request, state: State, tenant: Tenant):
    n, best_of = body.n or 1, body.best_of or body.n or 1
    if best_of < n:
        raise APIError(400, f"best_of ({best_of}) must be at least n ({n})", param="best_of", code="invalid_value")
    if best_of > n and body.stream:
        why = "best_of > n cannot be streamed (the best are known at the end)"
        raise APIError(400, why, param="best_of", code="invalid_value")
    engine = state.engine
    translate.check_model(body, state.model_name, state.names)
    items = choices.prompts(body.prompt, engine.target.vocab_size)

    def prepare(item: tuple[str | None, list[int] | None]) -> translate.EngineRequest:
        return translate.openai_request(engine, body, item, None, body.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS)

    jobs = await submit(state, body, tenant, "completions", "cmpl", items, prepare, param="prompt", copies=best_of)
    answer = CompletionAnswer(body, jobs, state.model_name, engine.tokenizer)
    return await openai_reply(
        jobs, body, request, answer, constraint_param=translate.constraint_param(body), metrics=state.metrics
    )


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
