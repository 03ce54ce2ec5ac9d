"""OpenAI's Responses routes: POST /v1/responses (the response object, or its server-sent
events), GET and DELETE /v1/responses/{id}; `mount` adds them and their ResponseStore to an app.

A request becomes the chat request it means (responses_translate.py) and one Job on the same
Serving queue as /v1/chat/completions', under the same API keys, tenant isolation and limits; its
answer (responses_answers.py) goes back through streams.responses_reply. previous_response_id
continues a stored response of the same API key: its conversation, its output, then the new
input, so the cache holds the prefix the follow-up shares.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request

from draftwise.server import responses_translate as t
from draftwise.server.errors import APIError
from draftwise.server.openai_routes import capacity, submit
from draftwise.server.responses_answers import ResponseAnswer
from draftwise.server.responses_protocol import ErrorResponse, ResponsesRequest, ResponseStore, Stored
from draftwise.server.state import State, Tenant
from draftwise.server.streams import responses_reply

_ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 408, 413, 415, 500, 503)}
_STREAM_RESPONSE = {
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
    "description": "The response object, or its server-sent events when `stream` is true.",
}

router = APIRouter()


def mount(app: FastAPI) -> None:
    """Add the routes and the app's store of responses."""
    app.state.responses = ResponseStore()
    app.include_router(router)


def _store(request: Request) -> ResponseStore:
    return request.app.state.responses


Store = Annotated[ResponseStore, Depends(_store)]


def _not_found(response_id: str, param: str = "response_id") -> APIError:
    return APIError(404, f"no response with id {response_id!r} was found", param=param, code="not_found")


@router.post("/v1/responses", tags=["openai"], responses={200: _STREAM_RESPONSE, **_ERRORS})
async def create_response(body: ResponsesRequest, request: Request, state: State, tenant: Tenant, store: Store):
    t.refuse_unsupported(body)
    previous = None
    if body.previous_response_id is not None:
        previous = store.get(tenant, body.previous_response_id)
        if previous is None:
            raise _not_found(body.previous_response_id, "previous_response_id")
    served = (state.model_name, state.names)
    prepared = await asyncio.to_thread(t.translate, state.engine, body, previous, served, capacity(state))
    reply = prepared.reply
    with t.in_responses_terms():
        [job] = await submit(state, prepared, tenant, "responses", "resp")
    answer = ResponseAnswer(reply, state.model_name, prepared.tools, reply.previous_response_id)

    def keep(final: dict[str, Any]) -> None:
        if reply.store:
            store.put(tenant, Stored(final, (*reply.conversation, *t.output_messages(final))))

    return await responses_reply(job, reply, request, answer, metrics=state.metrics, keep=keep)


@router.get("/v1/responses/{response_id}", tags=["openai"], responses=_ERRORS)
async def get_response(response_id: str, tenant: Tenant, store: Store) -> dict:
    stored = store.get(tenant, response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored.response


@router.delete("/v1/responses/{response_id}", tags=["openai"], responses=_ERRORS)
async def delete_response(response_id: str, tenant: Tenant, store: Store) -> dict:
    if not store.delete(tenant, response_id):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}
