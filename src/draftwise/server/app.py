"""The HTTP surface: `create_app(engine, model_name, api_key=None) -> FastAPI` for one model, and
`create_pool_app(sources, ...)` for several, loaded as requests name them (pool.py, model_router.py).

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
from dataclasses import dataclass

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
from draftwise.server.model_router import ModelRouter
from draftwise.server.pool import DEFAULT_KEEP_ALIVE_S, ModelPool, ModelSource
from draftwise.server.serving import MAX_QUEUE, Serving
from draftwise.server.state import Clients, ServerState


def model_state(name: str, engine: Engine, max_queue: int = MAX_QUEUE, names: Sequence[str] = ()) -> ServerState:
    """One served model's state: its engine, the queue and worker that feed it, its metrics.
    names: what else it answers to (its stores' names; names.py adds the spellings of `name`)."""
    metrics = ServerMetrics()
    return ServerState(
        engine=engine,
        serving=Serving(engine, metrics, max_queue=max_queue),
        metrics=metrics,
        model_name=name,
        fim_tokens=fim_tokens(engine.tokenizer),
        clients=Clients(),
        names=frozenset(names),
    )


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
    names: Sequence[str] = (),
) -> FastAPI:
    """api_key / api_keys: bearer keys, one per tenant (a tenant never learns how much of its prompt
    another tenant's request left in the cache). metrics_key: the operator's key for /metrics, which
    counts every tenant's requests; without it, a server of several tenants keeps /metrics closed.
    log_content: let error logs quote requests. body_timeout_s: a request body must have arrived
    this long after its headers (then 408). access: the Hosts and web origins answered
    (access.py; None: a loopback server's, and no page of another origin). An engine whose target
    has several slots decodes that many requests together; max_queue more may wait (then 503).
    names: what else the model answers to (other stores' names for its file; names.py adds the
    spellings of model_name)."""
    state = model_state(model_name, engine, max_queue, names)
    guards = _Guards(_keys(api_key, api_keys), metrics_key, log_content, body_timeout_s, access or Access())
    app = _app(state.metrics, guards, on_stop=state.serving.close)
    app.state.server = state
    app.state.serving = state.serving
    return app


def create_pool_app(
    sources: Sequence[ModelSource],
    *,
    budget_bytes: int | None = None,
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
    api_keys: Sequence[str] = (),
    metrics_key: str | None = None,
    log_content: bool = False,
    max_queue: int = MAX_QUEUE,
    body_timeout_s: float = BODY_TIMEOUT_S,
    access: Access | None = None,
) -> FastAPI:
    """A server of several models (pool.py): each request is answered by the model it names,
    loaded when first asked for and unloaded after keep_alive_s idle, or when the next would not
    fit budget_bytes (least recently used first). The other arguments are create_app's; max_queue
    bounds each model's queue."""
    pool = ModelPool(
        sources,
        lambda name, engine: model_state(name, engine, max_queue, pool.names_of(name)),
        budget_bytes=budget_bytes,
        keep_alive_s=keep_alive_s,
    )
    metrics = ServerMetrics()  # the server's own: errors answered before a model is chosen
    guards = _Guards(_keys(None, api_keys), metrics_key, log_content, body_timeout_s, access or Access())
    app = _app(metrics, guards, on_start=pool.start, on_stop=pool.close, router=(pool, metrics))
    app.state.server = None
    app.state.pool = pool
    return app


@dataclass(frozen=True)
class _Guards:
    keys: tuple[str, ...]
    metrics_key: str | None
    log_content: bool
    body_timeout_s: float
    access: Access


def _keys(api_key: str | None, api_keys: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*([api_key] if api_key else []), *api_keys]))


def _app(metrics: ServerMetrics, guards: _Guards, *, on_stop, on_start=None, router=None) -> FastAPI:
    """The routes and middlewares, innermost first: the model router (several models), the API-key
    Guard, the access guard, then Ollama's and Anthropic's error wording."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if on_start is not None:
            on_start()
        yield
        on_stop()

    # NOTE: no /docs or /redoc: FastAPI's pages load their scripts from a CDN, unusable offline;
    # /openapi.json is served and works with any OpenAPI viewer.
    app = FastAPI(
        title="draftwise",
        summary="OpenAI-compatible server for lossless speculative decoding.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.pool = None
    app.state.metrics = metrics
    if router is not None:
        pool, router_metrics = router
        # inside the Guard (keys first); it reads the app's routes to load only for one of them
        app.add_middleware(ModelRouter, pool=pool, metrics=router_metrics, routes=app.router)
    reply = errors.install(
        app,
        metrics,
        guards.keys,
        metrics_key=guards.metrics_key,
        log_content=guards.log_content,
        body_timeout_s=guards.body_timeout_s,
        public=page_routes.is_public,
    )
    app.add_middleware(AccessGuard, access=guards.access, reply=reply)  # before the key: a preflight has none
    app.add_middleware(ollama_routes.OllamaErrors)  # added last: it wraps both guards
    app.add_middleware(anthropic_routes.AnthropicErrors)  # so does this one
    app.include_router(openai_routes.router)
    app.include_router(tokenizer_routes.router)
    app.include_router(infill.router)
    app.include_router(ollama_routes.router)
    app.include_router(page_routes.router)
    app.include_router(anthropic_routes.router)
    responses_routes.mount(app)
    app.openapi = _without_422(app)
    return app


def _without_422(app: FastAPI):
    """app.openapi without FastAPI's 422 answers: a body that fails validation is a 400 in each
    protocol's own shape (errors.install), which every route's `responses` already describes."""
    default = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = default()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi
