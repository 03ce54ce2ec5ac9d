"""`/infill`: llama.cpp's code-completion route, as the llama.vim and llama.vscode plugins use it.

The request (llama_protocol.InfillRequest: input_prefix, input_suffix, input_extra, prompt,
n_predict, n_indent, t_max_predict_ms, samplers, ...) becomes a fill-in-the-middle prompt
(draftwise.fim, laid out and cut as llama.cpp's format_prompt_infill does) and a Job like any
other; the answer (answers.InfillAnswer) has the fields those clients read, streamed as
llama.cpp streams it (one JSON object per server-sent event, the last with "stop": true, no [DONE]).

Editors send a request every few keystrokes: a new request from the same client supersedes
(cancels) its previous one. A client is (API key, remote IP address): llama.vim opens a new
connection per request, so the connection cannot name it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from draftwise.server import choices, translate
from draftwise.server import protocol as p
from draftwise.server.answers import SUPERSEDED, InfillAnswer, indent_cut
from draftwise.server.answers import pick as _pick
from draftwise.server.errors import APIError, infill_refusal
from draftwise.server.llama_protocol import (
    APPLIED_SAMPLERS,
    DEFAULT_SAMPLERS,
    KNOWN_SAMPLERS,
    MAX_COMPLETIONS,
    InfillChunk,
    InfillRequest,
)
from draftwise.server.serving import Job
from draftwise.server.state import State, Tenant
from draftwise.server.streams import job_events, sse_response
from draftwise.server.translate import infill_logit_bias as logit_bias
from draftwise.server.translate import infill_sampling

# The names this module has always offered (tests/unit/test_fim.py imports some of them).
__all__ = [
    "APPLIED_SAMPLERS",
    "DEFAULT_SAMPLERS",
    "KNOWN_SAMPLERS",
    "MAX_COMPLETIONS",
    "SUPERSEDED",
    "InfillChunk",
    "InfillRequest",
    "_pick",
    "indent_cut",
    "infill_sampling",
    "logit_bias",
    "router",
]

router = APIRouter()


@router.post("/infill", tags=["llama.cpp"], responses={s: {"model": p.ErrorResponse} for s in (400, 401, 503)})
async def infill(body: InfillRequest, request: Request, state: State, tenant: Tenant):
    engine, clients = state.engine, state.clients
    client = (tenant, request.client.host if request.client else None)
    jobs: list[Job] = []
    try:
        prepared = await asyncio.to_thread(translate.infill, engine, body, state.fim_tokens)
        [one], reply = prepared.requests, prepared.reply
        jobs = [
            Job(f"infill-{uuid.uuid4().hex[:24]}", "infill", one.prompt_ids, tenant=tenant) for _ in range(reply.copies)
        ]
        clients.supersede(client, jobs)
        for copy, job in enumerate(jobs):
            choice = one.choice(copy)
            await asyncio.to_thread(state.serving.submit, job, choice.sampling, choice.speculation, choice.drafters)
    except Exception as exc:
        error = infill_refusal(exc)
        if error is None:
            raise
        for job in jobs:
            job.cancel("a sibling completion was refused")
        clients.done(client, jobs)
        raise error from None
    answer = InfillAnswer(reply, jobs, one.sampling, model_name=state.model_name, n_ctx=engine.target.n_ctx)
    streams = [job_events(job, request) for job in jobs]
    if reply.stream:
        return sse_response(_stream(answer, streams, state, lambda: clients.done(client, jobs)))
    try:
        async for index, event in choices.merged(streams):
            answer.advance(index, event)
    finally:
        answer.unfinished("the request ended")
        clients.done(client, jobs)
    results = [answer.final(index) for index in range(len(jobs))]
    # llama.cpp answers one completion as an object and several as a list of them
    return JSONResponse(results[0] if len(results) == 1 else results)


async def _stream(answer: InfillAnswer, streams: list, state: State, done) -> AsyncIterator[str]:
    """llama.cpp's stream: a partial object per new text, then each completion's final object;
    a failure ends it with an error object."""
    try:
        async for index, event in choices.merged(streams):
            try:
                new = answer.advance(index, event)
            except APIError as error:
                state.count(error)
                yield f"data: {json.dumps({'error': error.body()['error']})}\n\n"
                return
            if new:
                yield f"data: {json.dumps(answer.partial(index, new), ensure_ascii=False)}\n\n"
        for index in range(len(answer.completions)):
            yield f"data: {json.dumps(answer.final(index, ''), ensure_ascii=False)}\n\n"
    finally:
        answer.unfinished("the stream ended")
        done()
