"""Every failure as OpenAI's error JSON `{"error": {message, type, param, code}}`.

APIError carries a status and the fields; `install` registers the handlers (validation,
HTTP, unexpected) and the Guard middleware (bearer API key, body size cap), so nothing
reaches a client as a traceback, and each error is counted in the metrics.
"""

from __future__ import annotations

import hmac
import logging
import traceback
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
    """ASGI middleware: bearer-token check (every route but /health), a body size cap on the
    bytes actually read (Content-Length or chunked), and the last word on unexpected errors:
    a 500 in OpenAI's shape, logged by type and place only, never by message (messages can quote
    the request), unless the operator asked for request content in the logs.
    """

    def __init__(self, app, *, api_keys: tuple[str, ...], reply: Callable[[APIError], JSONResponse],
                 log_content: bool = False) -> None:
        self.app, self.api_keys, self.reply, self.log_content = app, api_keys, reply, log_content

    def _tenant(self, headers: dict) -> int | None:
        """Index of the request's API key, or None if it has none of them."""
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        found = None
        for i, key in enumerate(self.api_keys):  # every key compared: no timing hint of which matched
            if hmac.compare_digest(token.strip(), key.encode()):
                found = i
        return found

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        error = None
        if self.api_keys:
            tenant = self._tenant(headers)
            scope.setdefault("state", {})["tenant"] = tenant
            if tenant is None and scope["path"] != "/health":
                error = APIError(401, "missing or invalid API key (send 'Authorization: Bearer KEY')",
                                 code="invalid_api_key")
        length = headers.get(b"content-length", b"0")
        too_large = APIError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="body_too_large")
        if error is None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            error = too_large
        if error is not None:
            await self.reply(error)(scope, receive, send)
            return
        received, started, refused = 0, False, False

        async def counted_receive():
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > MAX_BODY_BYTES and not started:  # a chunked body has no Content-Length
                    # Answer now; the app then sees a client that went away, and nothing it sends is used.
                    refused = True
                    await self.reply(too_large)(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message):
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except Exception as exc:
            if refused:
                return
            if self.log_content:
                logger.error("unexpected error: %s", type(exc).__name__, exc_info=exc)
            else:
                logger.error("unexpected error: %s\n%s", type(exc).__name__,
                             "".join(traceback.format_tb(exc.__traceback__)).rstrip())
            if not started:
                await self.reply(APIError(500, "internal server error", type="server_error"))(scope, receive, send)


def install(app: FastAPI, metrics: ServerMetrics, api_keys: tuple[str, ...] = (), *,
            log_content: bool = False) -> Callable[[APIError], JSONResponse]:
    """Register the handlers and the guard on app; returns `reply(error) -> JSONResponse`."""

    def reply(error: APIError) -> JSONResponse:
        metrics.observe_error(error.status, error.type)
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        if error.code == "overloaded":
            headers = {"Retry-After": "1"}
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    app.add_middleware(Guard, api_keys=tuple(api_keys), reply=reply, log_content=log_content)

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
        message = _explain(first, param)
        # 400, as OpenAI and vLLM answer a malformed request (clients map 422 to another error class).
        return reply(APIError(400, f"{param or 'body'}: {message}", param=param, code="invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code if 400 <= exc.status_code < 500 else 500
        return reply(APIError(status, str(exc.detail), type="invalid_request_error" if status < 500 else "server_error",
                              code={404: "not_found", 405: "method_not_allowed"}.get(status)))

    return reply


def _explain(error: dict, param: str | None) -> str:
    """pydantic's message, made specific where it names the wrong rule for our fields."""
    if error["type"] in ("dict_type", "model_type", "model_attributes_type") and param is None:
        return "the body must be a JSON object (and Content-Type application/json)"
    if param == "stop" and error["type"] in ("string_type", "too_long"):
        return "give a string or a list of at most 16 non-empty strings"
    return error["msg"]


def _is_type_tag(part: str | int) -> bool:
    """pydantic names union members in error locations ('str', 'list[int]', 'constrained-str')."""
    return isinstance(part, str) and (part in {"str", "int", "float", "bool", "list", "dict"} or
                                      any(c in part for c in "[]-"))
