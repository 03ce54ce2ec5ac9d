"""ModelRouter: the ASGI middleware of a server of several models (pool.py). It reads a request's
body for its `model` (and Ollama's `keep_alive`), holds that model in the pool for the request's
whole life, streams included, and hands its ServerState to the routes (state.server_state reads
it). A request that names no model gets the default one; a name the server does not serve, a 404.

Only a request that a route would accept touches the pool: the route must exist for its path and
method and depend on a model (state.State), and the body must pass that route's schema, checked
here before anything loads. A refused body goes on to the route unheld, which words its 400 (an
unknown path, a wrong method: the app's 404 and 405); the lists of models, /health, /metrics,
the page and stored responses hold no model, so listing the models never loads one. Ollama's
unload request for a model that is not loaded is answered without loading it, and a request a
route refuses after all (4xx) leaves the model's keep-alive as it was.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Match

from draftwise.server import names, ollama_routes
from draftwise.server.errors import MODEL_UNAVAILABLE, APIError
from draftwise.server.keep_alive import KEEP_ALIVE_RULE, keep_alive_seconds
from draftwise.server.metrics import ServerMetrics
from draftwise.server.pool import ModelPool, ModelUnavailable
from draftwise.server.state import INVALID_KEY, STATE_KEY, server_state


def _requested(path: str, data: object) -> tuple[str | None, float | None]:
    """The body's model name (Ollama's /api/show and /api/pull also say `name`) and keep_alive.
    Raises APIError for a keep_alive that is no duration (it would decide when a model unloads)."""
    if not isinstance(data, dict):
        return None, None
    name = data.get("model")
    if not name and path in ("/api/show", "/api/pull"):
        name = data.get("name")
    keep_alive = keep_alive_seconds(data.get("keep_alive"))
    if keep_alive is None and data.get("keep_alive") is not None:
        raise APIError(400, f"keep_alive: {KEEP_ALIVE_RULE}", param="keep_alive", code="invalid_value")
    return (name if isinstance(name, str) else None), keep_alive


def _route(routes: Sequence[BaseRoute], scope) -> APIRoute | None:
    """The route that answers scope and depends on a model (None: an unknown path, a wrong
    method, a route that holds no model)."""
    for route in _flat(routes):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return route if isinstance(route, APIRoute) and _needs_model(route) else None
    return None


def _flat(routes: Sequence[BaseRoute]) -> Iterator[BaseRoute]:
    """The app's routes, those of its included routers in their place (newer FastAPI keeps an
    included router whole, as its `original_router`; none of ours has a prefix)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _flat(inner.routes)
        else:
            yield route


def _needs_model(route: APIRoute) -> bool:
    pending = list(route.dependant.dependencies)
    while pending:
        dependant = pending.pop()
        if dependant.call is server_state:
            return True
        pending.extend(dependant.dependencies)
    return False


def _schema_errors(route: APIRoute, body: bytes) -> tuple[object, list | None]:
    """(the body's JSON, the route's schema errors or None), as FastAPI would find them (a
    single body model, as every route that holds a model takes)."""
    try:
        data = json.loads(body) if body else None
    except (ValueError, RecursionError):  # the route answers the JSON error itself, before any model
        return None, [{"type": "json_invalid", "loc": ("body",), "msg": "JSON decode error", "input": {}}]
    field = route.body_field
    if field is None:
        return data, None
    if data is None:
        return None, [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
    _, errors = field.validate(data, {}, loc=("body",))
    return data, (errors or None)


class ModelRouter:
    """Inside the API-key Guard (which caps and times the body it reads here), so a request that
    may not be served loads nothing. Errors are OpenAI's shape; OllamaErrors and AnthropicErrors,
    outside, reword them for their routes. routes: the app's (read when a request comes)."""

    def __init__(self, app, *, pool: ModelPool, metrics: ServerMetrics, routes) -> None:
        self.app, self.pool, self.metrics, self.routes = app, pool, metrics, routes

    async def __call__(self, scope, receive, send) -> None:
        route = _route(self.routes.routes, scope) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        body, complete = b"", False
        while not complete:
            message = await receive()
            if message["type"] != "http.request":  # the client left, or the Guard answered (408, 413)
                return
            body += message.get("body", b"")
            complete = not message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        data, invalid = _schema_errors(route, body)
        try:  # keep_alive first: every route takes it, and only this decides what it means
            name, keep_alive_s = _requested(scope["path"], data)
        except APIError as error:
            await self._reply(error, scope, send)
            return
        if invalid is not None:  # the route words its 400; nothing is loaded for it
            await self.app({**scope, INVALID_KEY: invalid}, replay, send)
            return
        served = self.pool.resolve(name)
        if served is None:
            await self._reply(self._unknown(name), scope, send)
            return
        if keep_alive_s == 0 and not self.pool.is_loaded(served):
            unload = ollama_routes.unload_answer(scope["path"], data)
            if unload is not None:  # Ollama's unload of a model that is not loaded: nothing to do
                await unload(scope, replay, send)
                return
        status = 0

        async def watched_send(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            async with self.pool.use(served, keep_alive_s, accepted=lambda: 0 < status < 400) as state:
                await self.app({**scope, STATE_KEY: state}, replay, watched_send)
        except ModelUnavailable as exc:
            # NOTE: not "overloaded" (Anthropic's 529, which clients retry as a passing overload): a
            # model that cannot load stays so, and x-should-retry tells the OpenAI and Anthropic SDKs.
            error = APIError(503, str(exc), type="server_error", code=MODEL_UNAVAILABLE)
            await self._reply(error, scope, send, headers={"x-should-retry": "false"})

    def _unknown(self, name: str | None) -> APIError:
        served = names.listing(s.name for s in self.pool.sources)
        return APIError(
            404,
            f"the model {names.quoted(name)} is not served here (served: {served})",
            param="model",
            code="model_not_found",
        )

    async def _reply(self, error: APIError, scope, send, headers: dict[str, str] | None = None) -> None:
        self.metrics.observe_error(error.status, error.type)

        async def nothing():
            return {"type": "http.disconnect"}

        await JSONResponse(error.body(), status_code=error.status, headers=headers)(scope, nothing, send)
