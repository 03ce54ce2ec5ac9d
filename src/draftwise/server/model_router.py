"""ModelRouter: the ASGI middleware of a server of several models (pool.py). It reads a request's
body for its `model` (and Ollama's `keep_alive`), holds that model in the pool for the request's
whole life, streams included, and hands its ServerState to the routes (state.server_state reads
it). A request that names no model gets the default one; a name the server does not serve, a 404.

Requests that concern no one model (the lists of models, /health, /metrics, the page, stored
responses) hold none, so listing the models never loads one.
"""

from __future__ import annotations

import json
import math
import re

from fastapi.responses import JSONResponse

from draftwise.server.errors import APIError
from draftwise.server.metrics import ServerMetrics
from draftwise.server.pool import ModelPool, ModelUnavailable
from draftwise.server.state import STATE_KEY

# Paths that hold no model (GET and DELETE of these, and any OPTIONS).
_MODEL_FREE = re.compile(
    r"^/(health|metrics|openapi\.json|api/(tags|ps|version)|v1/models(/.*)?|v1/responses/.+|ui/.*)?$"
)
# Ollama's keep_alive duration: "5m", "1h30m", "300ms", "-1", "0", or a number of seconds.
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: object) -> float | None:
    """Ollama's keep_alive as seconds (negative: keep for ever); None where it is absent or not
    a duration (the route's own validation words that error). Example: "1h30m" -> 5400.0,
    "-1" -> -1.0, 0 -> 0.0."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) else None
    sign = -1.0 if text.startswith("-") else 1.0
    text = text.lstrip("+-")
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sign * sum(float(n) * _UNIT_S[u] for n, u in parts)


def _requested(path: str, body: bytes) -> tuple[str | None, float | None]:
    """The body's model name (Ollama's /api/show and /api/pull also say `name`) and keep_alive.
    Raises APIError for a keep_alive that is no duration (it would decide when a model unloads)."""
    try:
        data = json.loads(body) if body else None
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    name = data.get("model")
    if not name and path in ("/api/show", "/api/pull"):
        name = data.get("name")
    keep_alive = keep_alive_seconds(data.get("keep_alive"))
    if keep_alive is None and data.get("keep_alive") is not None:
        raise APIError(
            400,
            'keep_alive: give a duration such as "5m", "1h30m", 300 (seconds), 0 (unload now) or -1 (keep)',
            param="keep_alive",
            code="invalid_value",
        )
    return (name if isinstance(name, str) else None), keep_alive


class ModelRouter:
    """Inside the API-key Guard (which caps and times the body it reads here), so a request that
    may not be served loads nothing. Errors are OpenAI's shape; OllamaErrors and AnthropicErrors,
    outside, reword them for their routes."""

    def __init__(self, app, *, pool: ModelPool, metrics: ServerMetrics) -> None:
        self.app, self.pool, self.metrics = app, pool, metrics

    async def __call__(self, scope, receive, send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] == "OPTIONS"
            or (scope["method"] in ("GET", "HEAD", "DELETE") and _MODEL_FREE.match(scope["path"]))
        ):
            await self.app(scope, receive, send)
            return
        body, complete = b"", False
        while not complete:
            message = await receive()
            if message["type"] != "http.request":  # the client left, or the Guard answered (408, 413)
                return
            body += message.get("body", b"")
            complete = not message.get("more_body", False)
        try:
            name, keep_alive_s = _requested(scope["path"], body)
        except APIError as error:
            await self._reply(error, scope, send)
            return
        served = self.pool.resolve(name)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        if scope["path"] == "/api/show":  # told from the model's file, never loaded for it
            await self.app(scope, replay, send)
            return
        if served is None:
            served_names = ", ".join(s.name for s in self.pool.sources)
            await self._reply(
                APIError(
                    404,
                    f"the model {name!r} is not served here (served: {served_names})",
                    param="model",
                    code="model_not_found",
                ),
                scope,
                send,
            )
            return
        try:
            async with self.pool.use(served, keep_alive_s) as state:
                await self.app({**scope, STATE_KEY: state}, replay, send)
        except ModelUnavailable as exc:
            await self._reply(APIError(503, str(exc), type="server_error", code="model_unavailable"), scope, send)

    async def _reply(self, error: APIError, scope, send) -> None:
        self.metrics.observe_error(error.status, error.type)

        async def nothing():
            return {"type": "http.disconnect"}

        await JSONResponse(error.body(), status_code=error.status)(scope, nothing, send)
