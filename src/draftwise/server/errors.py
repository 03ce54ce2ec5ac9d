"""Every failure as OpenAI's error JSON `{"error": {message, type, param, code}}`.

APIError carries a status and the fields; `install` registers the handlers (validation,
HTTP, unexpected) and the Guard middleware (bearer API key, body size cap), so nothing
reaches a client as a traceback, and each error is counted in the metrics.
"""

from __future__ import annotations

import hmac
import logging
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from draftwise.server import protocol as p
from draftwise.server.metrics import ServerMetrics

logger = logging.getLogger("draftwise.server")

MAX_BODY_BYTES = 16 * 1024 * 1024


class APIError(Exception):
    """An error answered with OpenAI's error JSON."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return p.ErrorResponse(error=p.ErrorDetail(message=self.message, type=self.type, param=self.param,
                                                   code=self.code)).model_dump()


class Guard:
    """ASGI middleware: bearer-token check (every route but /health) and a body size cap.

    The cap reads Content-Length; a chunked body without one is not limited here.
    """

    def __init__(self, app, *, api_key: str | None, reply: Callable[[APIError], JSONResponse]) -> None:
        self.app, self.api_key, self.reply = app, api_key, reply

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            error = None
            if self.api_key is not None and scope["path"] != "/health":
                scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
                if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.api_key.encode()):
                    error = APIError(401, "missing or invalid API key (send 'Authorization: Bearer KEY')",
                                     code="invalid_api_key")
            length = headers.get(b"content-length", b"0")
            if error is None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
                error = APIError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="body_too_large")
            if error is not None:
                await self.reply(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def install(app: FastAPI, metrics: ServerMetrics, api_key: str | None) -> Callable[[APIError], JSONResponse]:
    """Register the handlers and the guard on app; returns `reply(error) -> JSONResponse`."""

    def reply(error: APIError) -> JSONResponse:
        metrics.observe_error(error.status, error.type)
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    app.add_middleware(Guard, api_key=api_key, reply=reply)

    @app.exception_handler(APIError)
    async def _api_error(_request: Request, exc: APIError) -> JSONResponse:
        return reply(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # A union field reports one error per member; the deepest one says most ("stop.0: too short").
        first = max(exc.errors(), key=lambda e: len(e["loc"]), default={"loc": (), "msg": "invalid", "type": ""})
        if first["type"] == "json_invalid":
            detail = first.get("ctx", {}).get("error", first["msg"])
            return reply(APIError(400, f"the body is not valid JSON: {detail}", code="invalid_json"))
        param = ".".join(str(part) for part in first["loc"] if part != "body" and not _is_type_tag(part)) or None
        return reply(APIError(422, f"{param or 'body'}: {first['msg']}", param=param, code="invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code if 400 <= exc.status_code < 500 else 500
        return reply(APIError(status, str(exc.detail), type="invalid_request_error" if status < 500 else "server_error",
                              code={404: "not_found", 405: "method_not_allowed"}.get(status)))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        logger.error("unexpected error: %r", exc, exc_info=exc)
        return reply(APIError(500, "internal server error", type="server_error"))

    return reply


def _is_type_tag(part: str | int) -> bool:
    """pydantic names union members in error locations ('str', 'list[int]', 'constrained-str')."""
    return isinstance(part, str) and (part in {"str", "int", "float", "bool", "list", "dict"} or
                                      any(c in part for c in "[]-"))
