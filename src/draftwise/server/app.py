"""The HTTP surface: `create_app(engine, model_name, api_key=None) -> FastAPI`.

It builds the app's ServerState (state.py) and mounts the routers: OpenAI's routes with
/health and /metrics (openai_routes.py), llama.cpp's /infill (infill.py) and /tokenize
(tokenizer_routes.py), Ollama's /api/* (ollama_routes.py), Anthropic's /v1/messages
(anthropic_routes.py), OpenAI's Responses (responses_routes.py), the chat page at / and /ui/*
(page_routes.py); errors.install adds the error handlers and the Guard middleware, and
OllamaErrors and AnthropicErrors around it word /api/*'s and /v1/messages' errors as theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI

from draftwise.engine import Engine
from draftwise.fim import fim_tokens
from draftwise.server import (
    anthropic_routes,
    errors,
    infill,
    ollama_routes,
    openai_routes,
    page_routes,
    responses_routes,
    tokenizer_routes,
)
from draftwise.server.access import Access, AccessGuard
from draftwise.server.errors import BODY_TIMEOUT_S
from draftwise.server.metrics import ServerMetrics
from draftwise.server.serving import MAX_QUEUE, Serving
from draftwise.server.state import Clients, ServerState


def create_app(
    engine: Engine,
    model_name: str,
    api_key: str | None = None,
    *,
    api_keys: Sequence[str] = (),
    metrics_key: str | None = None,
    log_content: bool = False,
    max_queue: int = MAX_QUEUE,
    body_timeout_s: float = BODY_TIMEOUT_S,
    access: Access | None = None,
) -> FastAPI:
    """api_key / api_keys: bearer keys, one per tenant (a tenant never learns how much of its prompt
    another tenant's request left in the cache). metrics_key: the operator's key for /metrics, which
    counts every tenant's requests; without it, a server of several tenants keeps /metrics closed.
    log_content: let error logs quote requests. body_timeout_s: a request body must have arrived
    this long after its headers (then 408). access: the Hosts and web origins answered
    (access.py; None: a loopback server's, and no page of another origin). An engine whose target
    has several slots decodes that many requests together; max_queue more may wait (then 503)."""
    keys = tuple(dict.fromkeys([*([api_key] if api_key else []), *api_keys]))
    metrics = ServerMetrics()
    serving = Serving(engine, metrics, max_queue=max_queue)
    state = ServerState(
        engine=engine,
        serving=serving,
        metrics=metrics,
        model_name=model_name,
        fim_tokens=fim_tokens(engine.tokenizer),
        clients=Clients(),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        serving.close()

    # NOTE: no /docs or /redoc: FastAPI's pages load their scripts from a CDN, unusable offline;
    # /openapi.json is served and works with any OpenAPI viewer.
    app = FastAPI(
        title="draftwise",
        summary="OpenAI-compatible server for lossless speculative decoding.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.server = state
    app.state.serving = serving
    reply = errors.install(
        app,
        metrics,
        keys,
        metrics_key=metrics_key,
        log_content=log_content,
        body_timeout_s=body_timeout_s,
        public=page_routes.is_public,
    )
    app.add_middleware(AccessGuard, access=access or Access(), reply=reply)  # before the key: a preflight has none
    app.add_middleware(ollama_routes.OllamaErrors)  # added last: it wraps both guards
    app.add_middleware(anthropic_routes.AnthropicErrors)  # so does this one
    app.include_router(openai_routes.router)
    app.include_router(tokenizer_routes.router)
    app.include_router(infill.router)
    app.include_router(ollama_routes.router)
    app.include_router(page_routes.router)
    app.include_router(anthropic_routes.router)
    responses_routes.mount(app)
    return app
