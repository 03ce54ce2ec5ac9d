"""What every route reads: the app's `ServerState` (engine, queue, metrics, model name) and the
request's tenant, as FastAPI dependencies (`State`, `Tenant`).

create_app builds one ServerState per app and keeps it on `app.state.server`; the Guard
middleware (errors.py) has checked the API key and set the tenant before any route runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError

from draftwise.engine import Engine
from draftwise.fim import FimTokens
from draftwise.server import names as model_names
from draftwise.server.answers import SUPERSEDED
from draftwise.server.errors import APIError
from draftwise.server.metrics import ServerMetrics
from draftwise.server.serving import Job, Serving


class Clients:
    """The /infill request each client has running (its jobs, one per completion); a newer one
    from the same client cancels them (their cancel_reason: SUPERSEDED)."""

    def __init__(self) -> None:
        self._jobs: dict[tuple, list[Job]] = {}

    def supersede(self, client: tuple, jobs: list[Job]) -> None:
        for previous in self._jobs.get(client, ()):
            previous.cancel(SUPERSEDED)
        self._jobs[client] = jobs

    def done(self, client: tuple, jobs: list[Job]) -> None:
        if self._jobs.get(client) is jobs:
            del self._jobs[client]


@dataclass
class ServerState:
    """One app's engine and everything its routes share."""

    engine: Engine
    serving: Serving
    metrics: ServerMetrics
    model_name: str
    fim_tokens: FimTokens | None  # the model's fill-in-the-middle tokens (None: /infill answers 400)
    clients: Clients
    created: int = field(default_factory=lambda: int(time.time()))
    names: frozenset[str] = frozenset()  # what else its stores call it (names.py adds the spellings)

    def answers_to(self, requested: str | None) -> bool:
        """Whether a request's `model` names this model (names.answers_to decides)."""
        return model_names.answers_to(requested, self.model_name, self.names)

    def count(self, error: APIError) -> None:
        """Count an error answered inside a stream (the handlers count the others)."""
        self.metrics.observe_error(error.status, error.type)


# The scope key under which a server of several models (model_router.py) puts the request's model,
# and the one under which it puts the schema errors of a body it loaded no model for.
STATE_KEY = "draftwise.state"
INVALID_KEY = "draftwise.invalid"


def server_state(request: Request) -> ServerState:
    """The request's model: the one the ModelRouter holds for it, else the app's only one. A body
    the router found invalid is refused here, in the route's own error shape: FastAPI resolves
    this dependency before it validates the body, and the router loaded no model for it."""
    invalid = request.scope.get(INVALID_KEY)
    if invalid is not None:
        raise RequestValidationError(invalid)
    state = request.scope.get(STATE_KEY) or request.app.state.server
    if state is None:  # a route of a server of several models that the router let through unheld
        raise APIError(500, f"{request.url.path} has no model to answer from", type="server_error")
    return state


def tenant(request: Request) -> int | None:
    """Which API key sent the request (None: the server has none)."""
    return request.scope.get("state", {}).get("tenant")


def operator(request: Request) -> bool:
    """Whether the request may see every tenant's activity (the Guard decides, errors.py)."""
    return bool(request.scope.get("state", {}).get("operator", False))


State = Annotated[ServerState, Depends(server_state)]
Tenant = Annotated[int | None, Depends(tenant)]
Operator = Annotated[bool, Depends(operator)]


def model_pool(request: Request):
    """A server of several models' ModelPool (pool.py); None for a server of one."""
    return request.app.state.pool


Pool = Annotated[object, Depends(model_pool)]
