"""Every failure as OpenAI's error JSON `{"error": {message, type, param, code}}`.

APIError carries a status and the fields; `install` registers the handlers (validation,
HTTP, unexpected) and the Guard middleware (bearer API key, the operator's key for
/metrics, body size cap, body deadline), so nothing reaches a client as a traceback, and
each error is counted in the metrics. `openai_refusal` and `infill_refusal` name the answer
to a library error raised while a request is translated or queued.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from draftwise.errors import BackendError, ConfigError, ConstraintError, PromptTooLongError
from draftwise.server import protocol as p
from draftwise.server.metrics import ServerMetrics
from draftwise.server.serving import ServerBusy

logger = logging.getLogger("draftwise.server")

MAX_BODY_BYTES = 16 * 1024 * 1024
# A request's whole body must arrive this long after its headers: 16 MB at 300 kB/s. A client
# that trickles it would otherwise hold a connection (and a worker's memory) for ever.
BODY_TIMEOUT_S = 60.0
# A connection must send a request's headers (a few hundred bytes) this long after it opens or
# after its previous response; half-sent headers otherwise hold it open for ever.
HEADER_TIMEOUT_S = 10.0


# The code of a model that cannot be loaded (its file, its memory): no retry makes it load.
MODEL_UNAVAILABLE = "model_unavailable"

# The statuses an OpenAI-shaped route may answer with its error JSON (its OpenAPI `responses`).
ERROR_STATUSES = {status: {"model": p.ErrorResponse} for status in (400, 401, 403, 404, 408, 413, 415, 500, 503)}


class APIError(Exception):
    """An error answered with OpenAI's error JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return p.ErrorResponse(
            error=p.ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        ).model_dump()


def openai_refusal(exc: BaseException, *, param: str, constraint_param: str) -> APIError | None:
    """The answer of /v1/* to exc, raised while its request was translated or queued (param: the
    request's prompt field, "prompt" or "messages"); None: exc is no refusal (a bug: re-raise it)."""
    if isinstance(exc, UnicodeEncodeError):  # a lone surrogate ("\udfff") is not text a tokenizer can take
        return APIError(
            400,
            f"the request holds U+{ord(exc.object[exc.start]):04X}, a lone surrogate, which is not valid Unicode text",
            param=param,
            code="invalid_value",
        )
    if isinstance(exc, PromptTooLongError):
        return APIError(400, str(exc), param=param, code="context_length_exceeded")
    if isinstance(exc, ServerBusy):
        return APIError(503, str(exc), type="server_error", code="overloaded")
    if isinstance(exc, ConstraintError):
        return APIError(400, str(exc), param=constraint_param, code="invalid_value")
    if isinstance(exc, ConfigError):
        return APIError(400, str(exc), code="invalid_value")
    if isinstance(exc, BackendError):  # the tokenizer or chat template refused the input
        return APIError(400, str(exc), param=param, code="invalid_prompt")
    if type(exc).__module__.startswith("jinja2"):  # a chat template's raise_exception()
        return APIError(400, f"the chat template rejected the messages: {exc}", param="messages", code="invalid_prompt")
    return None


# The /infill fields whose library errors name them first ("logit_bias: ...").
_INFILL_FIELDS = ("logit_bias", "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty")


def infill_refusal(exc: BaseException) -> APIError | None:
    """The answer of /infill to exc, raised while its request was translated or queued; None:
    exc is no refusal (re-raise it)."""
    if isinstance(exc, UnicodeEncodeError):
        return APIError(
            400, f"the request holds U+{ord(exc.object[exc.start]):04X}, a lone surrogate", code="invalid_value"
        )
    if isinstance(exc, PromptTooLongError):
        return APIError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, ServerBusy):
        return APIError(503, str(exc), type="server_error", code="overloaded")
    if isinstance(exc, (ConfigError, BackendError)):
        param = next((f for f in _INFILL_FIELDS if str(exc).startswith(f)), None)
        return APIError(400, str(exc), param=param, code="invalid_value")
    return None


class Guard:
    """ASGI middleware: bearer-token check (every route but /health and the `public` ones: the
    chat page, page_routes.is_public), the metrics key on
    /metrics, a body size cap on the bytes actually read (Content-Length or chunked), a
    deadline for the body, and the last word on unexpected errors: a 500 in OpenAI's shape,
    logged by type and place only, never by message (messages can quote the request), unless
    the operator asked for request content in the logs.

    /metrics counts every tenant's requests (prompt tokens reused, errors, rates), so with
    several API keys it answers the metrics key alone, and nobody when there is none.
    """

    def __init__(
        self,
        app,
        *,
        api_keys: tuple[str, ...],
        reply: Callable[[APIError], JSONResponse],
        metrics_key: str | None = None,
        log_content: bool = False,
        body_timeout_s: float = BODY_TIMEOUT_S,
        public: Callable[[str, str, str], bool] = lambda _method, _path, _accept: False,
    ) -> None:
        self.app, self.api_keys, self.reply, self.log_content = app, api_keys, reply, log_content
        self.metrics_key, self.body_timeout_s, self.public = metrics_key, body_timeout_s, public

    @staticmethod
    def _key_index(headers: dict, keys: tuple[str, ...]) -> int | None:
        """Index of the request's bearer key among keys, or None if it has none of them."""
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        found = None
        for i, key in enumerate(keys):  # every key compared: no timing hint of which matched
            if hmac.compare_digest(token.strip(), key.encode()):
                found = i
        return found

    def _keyless(self, scope, headers: dict) -> bool:
        """/health and the public requests answer without a key."""
        accept = headers.get(b"accept", b"").decode("latin-1")
        return scope["path"] == "/health" or self.public(scope["method"], scope["path"], accept)

    def _operator(self, headers: dict, tenant: int | None) -> bool:
        """Whether the request may see every tenant's activity (/metrics, /health's figures): it
        holds the metrics key; or the server has none and at most one API key, and this holds it."""
        if self.metrics_key:
            return self._key_index(headers, (self.metrics_key,)) == 0
        return not self.api_keys or (len(self.api_keys) == 1 and tenant == 0)

    def _refusal(self, scope, headers: dict) -> APIError | None:
        """Why the request is refused before the app sees it (API key, metrics key, size), if it is."""
        tenant = self._key_index(headers, self.api_keys) if self.api_keys else None
        state = scope.setdefault("state", {})
        if self.api_keys:
            state["tenant"] = tenant
        state["operator"] = self._operator(headers, tenant)
        if scope["path"] == "/metrics" and (self.metrics_key or len(self.api_keys) > 1):
            if self.metrics_key and self._key_index(headers, (self.metrics_key,)) == 0:
                return None
            if tenant is None:
                return APIError(
                    401, "/metrics needs the metrics key (send 'Authorization: Bearer KEY')", code="invalid_api_key"
                )
            return APIError(
                403,
                "/metrics counts every tenant's requests, so it answers the operator's metrics key "
                "only" + ("" if self.metrics_key else ", and this server was started without one"),
                code="permission_denied",
            )
        if self.api_keys and tenant is None and not self._keyless(scope, headers):
            return APIError(
                401, "missing or invalid API key (send 'Authorization: Bearer KEY')", code="invalid_api_key"
            )
        length = headers.get(b"content-length", b"0")
        if not length.isdigit():  # uvicorn's parser refuses these first; other servers may not
            return APIError(
                400,
                f"Content-Length must be a byte count, got {length.decode('latin-1')[:32]!r}",
                code="invalid_content_length",
            )
        if int(length) > MAX_BODY_BYTES:
            return APIError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="body_too_large")
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "websocket":  # no route takes one, and no key was checked for it
            await refuse_websocket(receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        error = self._refusal(scope, dict(scope["headers"]))
        if error is not None:
            await self.reply(error)(scope, receive, send)
            return
        received, started, refused, body_done = 0, False, False, False
        deadline = time.monotonic() + self.body_timeout_s

        async def refuse(error: APIError) -> dict:
            """Answer now; the app then sees a client that went away, and nothing it sends is used."""
            nonlocal refused
            refused = True
            await self.reply(error)(scope, receive, send)
            return {"type": "http.disconnect"}

        async def counted_receive():
            nonlocal received, body_done
            if refused:
                return {"type": "http.disconnect"}
            if body_done or started:  # after the body, receive() only waits for the client to leave
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                return await refuse(
                    APIError(
                        408,
                        f"the request body did not arrive within {self.body_timeout_s:g} s of its headers",
                        code="request_timeout",
                    )
                )
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > MAX_BODY_BYTES:  # a chunked body has no Content-Length
                    return await refuse(
                        APIError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="body_too_large")
                    )
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
                logger.error(
                    "unexpected error: %s\n%s",
                    type(exc).__name__,
                    "".join(traceback.format_tb(exc.__traceback__)).rstrip(),
                )
            if not started:
                await self.reply(APIError(500, "internal server error", type="server_error"))(scope, receive, send)


async def refuse_websocket(receive, send) -> None:
    """Refuse a WebSocket before it opens (the server answers its handshake with 403): no route
    takes one, and the guards check HTTP requests only."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1008})


def install(
    app: FastAPI,
    metrics: ServerMetrics,
    api_keys: tuple[str, ...] = (),
    *,
    metrics_key: str | None = None,
    log_content: bool = False,
    body_timeout_s: float = BODY_TIMEOUT_S,
    public: Callable[[str, str, str], bool] = lambda _method, _path, _accept: False,
) -> Callable[[APIError], JSONResponse]:
    """Register the handlers and the guard on app; returns `reply(error) -> JSONResponse`.
    public(method, path, accept): the requests that need no key (by default none)."""

    def reply(error: APIError) -> JSONResponse:
        metrics.observe_error(error.status, error.type)
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        if error.code == "overloaded":
            headers = {"Retry-After": "1"}
        if error.status == 408:  # the rest of the body may still come: the connection cannot be reused
            headers = {"Connection": "close"}
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    app.add_middleware(
        Guard,
        api_keys=tuple(api_keys),
        reply=reply,
        metrics_key=metrics_key,
        log_content=log_content,
        body_timeout_s=body_timeout_s,
        public=public,
    )

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
        parts = [str(part) for part in first["loc"] if part != "body" and not _is_type_tag(part)]
        # fields.WireModel names the place inside a free-form field ("options" -> "options.num_predict")
        parts += [str(part) for part in first.get("ctx", {}).get("within", ())]
        param = ".".join(parts) or None
        message = _explain(first, param)
        # 400, as OpenAI and vLLM answer a malformed request (clients map 422 to another error class).
        return reply(APIError(400, f"{param or 'body'}: {message}", param=param, code="invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> Response:
        if isinstance(exc.__cause__, ClientDisconnect):  # the Guard answered already (408, 413), or nobody listens
            return Response(status_code=400)
        unreadable = _unreadable_body(exc.__cause__)
        if unreadable is not None:
            return reply(unreadable)
        status = exc.status_code if 400 <= exc.status_code < 500 else 500
        return reply(
            APIError(
                status,
                str(exc.detail),
                type="invalid_request_error" if status < 500 else "server_error",
                code={404: "not_found", 405: "method_not_allowed"}.get(status),
            )
        )

    return reply


def _unreadable_body(cause: BaseException | None) -> APIError | None:
    """FastAPI's one "error parsing the body" made specific, from the exception behind it."""
    if isinstance(cause, UnicodeDecodeError):
        return APIError(
            400,
            f"the body is not valid UTF-8 (byte 0x{cause.object[cause.start]:02x} at offset "
            f"{cause.start}); JSON text must be UTF-8",
            code="invalid_encoding",
        )
    if isinstance(cause, RecursionError):
        return APIError(400, "the body's JSON nests arrays and objects too deeply to parse", code="json_too_deep")
    return None


def _explain(error: dict, param: str | None) -> str:
    """pydantic's message, made specific where it names the wrong rule for our fields."""
    if error["type"] in ("dict_type", "model_type", "model_attributes_type") and param is None:
        return "the body must be a JSON object (and Content-Type application/json)"
    if param == "stop" and error["type"] in ("string_type", "too_long"):
        return "give a string or a list of at most 16 non-empty strings"
    return error["msg"]


def _is_type_tag(part: str | int) -> bool:
    """pydantic names union members in error locations ('str', 'list[int]', 'constrained-str')."""
    return isinstance(part, str) and (
        part in {"str", "int", "float", "bool", "list", "dict"} or any(c in part for c in "[]-")
    )


# ---------------------------------------------------------------------- below the app: uvicorn
def uvicorn_options(*, header_timeout_s: float = HEADER_TIMEOUT_S, http: str = "auto") -> dict[str, Any]:
    """Keyword arguments for `uvicorn.run` / `uvicorn.Config` that serve the app safely: its HTTP
    protocol (http: "httptools", "h11", or "auto", which picks httptools where it is installed,
    as uvicorn does) with a deadline for the request headers, and malformed requests answered in
    OpenAI's error JSON, not plain text.

    Example: `uvicorn.run(app, host=host, port=port, **uvicorn_options())`.
    """
    if http not in ("auto", "h11", "httptools"):
        raise ValueError(f"http must be auto, h11 or httptools, got {http!r}")
    try:
        if http == "h11":
            raise ImportError
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        if http == "httptools":
            raise
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    protocol = type(f"Guarded{base.__name__}", (_GuardedProtocol, base), {"header_timeout_s": header_timeout_s})
    return {"http": protocol}


class _GuardedProtocol:
    """Mixed into a uvicorn HTTP protocol: a connection waiting for a request's headers longer
    than header_timeout_s is closed (uvicorn's keep-alive timer stops at the first byte of them),
    and uvicorn's plain-text 400 for a request it cannot parse becomes OpenAI's error JSON."""

    header_timeout_s = HEADER_TIMEOUT_S
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._await_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_headers()

    def connection_lost(self, exc) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = None
        if not self.transport.is_closing():
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late, self.cycle)

    def _headers_late(self, last_cycle) -> None:
        """Close the connection unless a request arrived since the timer started (or is running)."""
        self._header_timer = None
        waiting = self.cycle is last_cycle and (last_cycle is None or last_cycle.response_complete)
        if waiting and not self.transport.is_closing():
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        # NOTE: uvicorn calls this while handling the parser's exception, which names the fault.
        fault = sys.exc_info()[1]
        detail = str(fault).strip() if fault is not None and str(fault).strip() else msg
        body = json.dumps(APIError(400, f"malformed HTTP request: {detail}", code="malformed_request").body()).encode()
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        self.transport.close()


async def rewrite_errors(app, scope, receive, send, rewrite: Callable[[int, bytes], tuple[int, bytes]]) -> None:
    """Run an ASGI app, holding back any answer of status 400 and above until its body is whole,
    and send `rewrite(status, body)` in its place: how a protocol with its own error shape
    (Ollama's, Anthropic's) answers the errors the shared routes and guards raise in OpenAI's."""
    held: dict | None = None
    body = b""

    async def rewriting_send(message) -> None:
        nonlocal held, body
        if message["type"] == "http.response.start" and message["status"] >= 400:
            held = message
            return
        if held is None or message["type"] != "http.response.body":
            await send(message)
            return
        body += message.get("body", b"")
        if message.get("more_body", False):
            return
        status, new = rewrite(held["status"], body)
        kept = [(k, v) for k, v in held.get("headers", []) if k.lower() != b"content-length"]
        await send({**held, "status": status, "headers": [*kept, (b"content-length", str(len(new)).encode())]})
        await send({"type": "http.response.body", "body": new})

    await app(scope, receive, rewriting_send)
