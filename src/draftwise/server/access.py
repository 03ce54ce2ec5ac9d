"""Who may reach the server from a browser: the Host allow-list (DNS rebinding), the Origin check
with CORS headers for the origins allowed (other web pages), and JSON-only bodies (a browser's
"simple" cross-site POST). `Access` says what is allowed; `AccessGuard` is the ASGI middleware
that enforces it, before the API-key Guard (errors.py), so a CORS preflight needs no key.

A page of another origin can send a "simple" POST (text/plain, no preflight) to a local server,
and a DNS-rebinding page becomes same-origin with it; Ollama answers both with 403 from Host and
Origin allow-lists (its OLLAMA_ORIGINS). Example: `Access(allowed_origins=("http://localhost:*",))`
lets a page on any localhost port call the API; `Host: evil.example` is still refused.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from draftwise.errors import ConfigError
from draftwise.server.errors import APIError, refuse_websocket

LOOPBACK_BINDS = ("127.0.0.1", "localhost", "::1", "[::1]")
# A request whose body is one of these is read as JSON on Ollama's routes when no browser sent
# it: the `curl -d` of Ollama's docs sends application/x-www-form-urlencoded.
_CURL_FORM = b"application/x-www-form-urlencoded"
_BODY_METHODS = ("POST", "PUT", "PATCH")
_PREFLIGHT_MAX_AGE_S = "600"
_METHODS = "GET, POST, DELETE, HEAD, OPTIONS"


def _is_loopback_bind(host: str) -> bool:
    if host in LOOPBACK_BINDS:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_origin_pattern(pattern: str) -> str:
    """An --allowed-origins entry, lower-cased: "*", "null", or SCHEME://HOST[:PORT] with "*" for
    any part of one (e.g. "http://localhost:*", "https://*.example.com"); no path."""
    value = pattern.strip().lower()
    if value in ("*", "null"):
        return value
    parts = urlsplit(value.replace("*", "x"))
    if not parts.scheme or not parts.netloc or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(
            f"allowed origin {pattern!r} is not an origin: give SCHEME://HOST[:PORT] "
            f"(e.g. https://app.example, chrome-extension://ID, http://localhost:*), 'null' or '*'"
        )
    return value.rstrip("/")


def _check_host_pattern(pattern: str) -> str:
    value = pattern.strip().lower()
    if not value or any(c in value for c in "/@ "):
        raise ConfigError(f"allowed host {pattern!r} is not a host name: give NAME or *.DOMAIN (no scheme, no port)")
    return value


@dataclass(frozen=True)
class Access:
    """bind_host: the interface the server listens on. Bound to a loopback address, only requests
    whose Host names this machine (localhost, *.localhost, an IP address, the machine's host name)
    or one of allowed_hosts are answered; bound to another interface, the Host is checked only
    when allowed_hosts is given ("*": any). allowed_origins: the web origins, besides the page's
    own, whose pages may call the API from a browser (patterns with "*"; "*" allows every page)."""

    bind_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_hosts", tuple(_check_host_pattern(h) for h in self.allowed_hosts))
        object.__setattr__(self, "allowed_origins", tuple(_check_origin_pattern(o) for o in self.allowed_origins))

    @property
    def checks_host(self) -> bool:
        return _is_loopback_bind(self.bind_host) or bool(self.allowed_hosts)

    def host_allowed(self, host_header: str) -> bool:
        """Whether a request with this Host header is answered. Example (bound to 127.0.0.1):
        "127.0.0.1:8000" -> True, "localhost" -> True, "evil.example:8000" -> False."""
        if not self.checks_host or "*" in self.allowed_hosts:
            return True
        name = _host_name(host_header)
        if name is None:
            return False
        if name == "" or name == "localhost" or name.endswith(".localhost") or name == _machine_name():
            return True  # no Host (HTTP/1.0): no browser sends such a request
        try:
            ipaddress.ip_address(name)
            return True  # a rebinding page names its own domain, never an address
        except ValueError:
            pass
        return any(fnmatchcase(name, pattern) for pattern in self.allowed_hosts)

    def origin_allowed(self, origin: str, host_header: str) -> bool:
        """Whether a page of `origin` may call the API: the page's own origin (the server's page),
        or one of allowed_origins."""
        if _same_origin(origin, host_header):
            return True
        value = origin.strip().lower()
        return any(pattern == "*" or _origin_pattern(pattern).fullmatch(value) for pattern in self.allowed_origins)


@functools.lru_cache(maxsize=256)
def _origin_pattern(pattern: str) -> re.Pattern:
    """An allowed-origins pattern as a regular expression, each "*" matching within its own part
    only: the scheme's characters, a host's (no ":", "/", "@"), a port's digits. Example:
    "http://localhost:*" matches "http://localhost:3000", not "http://localhost:3000.evil.com"."""
    scheme, sep, netloc = pattern.partition("://")
    if not sep:  # "null"
        return re.compile(re.escape(pattern))
    host, port = netloc, None
    if netloc.startswith("["):  # an IPv6 address: its colons are not the port's
        end = netloc.find("]") + 1
        host, rest = netloc[:end], netloc[end:]
        port = rest[1:] if rest.startswith(":") else None
    elif ":" in netloc:
        host, _, port = netloc.rpartition(":")

    def part(text: str, star: str) -> str:
        return "".join(star if c == "*" else re.escape(c) for c in text)

    regex = part(scheme, r"[a-z0-9+.\-]*") + "://" + part(host, r"[^:/@?#\[\]\s]*")
    return re.compile(regex if port is None else f"{regex}:{part(port, '[0-9]+')}")


def _host_name(host_header: str) -> str | None:
    """The Host header's name, lower-cased, without its port or brackets; None if malformed.
    Example: "[::1]:8000" -> "::1", "LocalHost:80" -> "localhost"."""
    value = host_header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1 :] and not value[end + 1 :].startswith(":")):
            return None
        return value[1:end]
    name, _, port = value.partition(":")
    if port and not port.isdigit():
        return None
    return name.rstrip(".")


def _machine_name() -> str:
    return socket.gethostname().lower()


class AccessGuard:
    """ASGI middleware enforcing an Access: 403 for a Host or an Origin it does not allow, 415 for
    a request body that is not JSON, the preflight answer (204) and CORS headers for an allowed
    origin. `reply(APIError) -> Response` answers in OpenAI's error shape, which OllamaErrors and
    AnthropicErrors (outside this middleware) reword for their routes."""

    def __init__(self, app, *, access: Access, reply: Callable) -> None:
        self.app, self.access, self.reply = app, access, reply

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "websocket":  # no route takes one: refused before one ever does
            await refuse_websocket(receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        malformed = _host_header_fault(scope)
        if malformed is not None:
            await self.reply(APIError(400, malformed, code="invalid_host_header"))(scope, receive, send)
            return
        if not self.access.host_allowed(host):
            error = APIError(
                403,
                f"this server does not answer requests for host {host[:100]!r} (a page that rebinds its "
                "name to this machine would send that); start it with --allowed-hosts NAME to accept it",
                type="permission_error",
                code="host_not_allowed",
            )
            await self.reply(error)(scope, receive, send)
            return
        origin = headers.get(b"origin")
        cors = None
        if origin is not None:
            text = origin.decode("latin-1")
            if not self.access.origin_allowed(text, host):
                error = APIError(
                    403,
                    f"requests from web pages of origin {text[:100]!r} are refused; start the server with "
                    "--allowed-origins ORIGIN to let that page call it",
                    type="permission_error",
                    code="origin_not_allowed",
                )
                await self.reply(error)(scope, receive, send)
                return
            cors = text if not _same_origin(text, host) else None
        if cors is not None and scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
            await _preflight(cors, headers, send)
            return
        if scope["method"] in _BODY_METHODS:
            refusal = _non_json_body(headers, scope["path"])
            if refusal is not None:
                await self.reply(refusal)(scope, receive, send)
                return
            if headers.get(b"content-type", b"").split(b";")[0].strip().lower() == _CURL_FORM:
                kept = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope = {**scope, "headers": [*kept, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send if cors is None else _with_cors(send, cors))


def _host_header_fault(scope) -> str | None:
    """Why the request's Host header breaks RFC 9112 section 3.2, which asks for a 400: several
    Host headers (a guard would read one, a proxy another), or none or an empty one on HTTP/1.1."""
    hosts = [value for key, value in scope["headers"] if key == b"host"]
    if len(hosts) > 1:
        return f"the request has {len(hosts)} Host headers; HTTP/1.1 allows one"
    if scope.get("http_version") == "1.1" and not (hosts and hosts[0].strip()):
        return "an HTTP/1.1 request must name its Host (RFC 9112, section 3.2)"
    return None


def _same_origin(origin: str, host: str) -> bool:
    """Whether a page of `origin` is the server's own (the chat page): same scheme-less host:port."""
    parts = urlsplit(origin.strip().lower())
    return parts.scheme in ("http", "https") and bool(parts.netloc) and parts.netloc == host.strip().lower()


def _browser_sent(headers: dict) -> bool:
    """Whether a browser sent the request: browsers name its Origin on every POST and send
    Sec-Fetch-* headers on every request; curl and the SDKs send neither."""
    return b"origin" in headers or b"sec-fetch-site" in headers or b"sec-fetch-mode" in headers


def _non_json_body(headers: dict, path: str) -> APIError | None:
    """The 415 for a body that is not JSON (every route with a body takes JSON), or None. A body
    without Content-Type is read as JSON, as FastAPI reads it."""
    value = headers.get(b"content-type")
    if value is None:
        return None
    media = value.split(b";")[0].strip().lower()
    if media == b"application/json" or media.endswith(b"+json"):
        return None
    if media == _CURL_FORM and path.startswith("/api/") and not _browser_sent(headers):
        return None
    return APIError(
        415,
        f"the body must be JSON (Content-Type: application/json), got Content-Type {value.decode('latin-1')[:80]!r}",
        code="unsupported_media_type",
    )


def _cors_headers(origin: str, vary: bytes = b"") -> list[tuple[bytes, bytes]]:
    return [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-expose-headers", b"*"),
        (b"vary", vary + b", Origin" if vary else b"Origin"),
    ]


async def _preflight(origin: str, headers: dict, send) -> None:
    """A CORS preflight from an allowed origin: the methods, the headers it asked for, 10 minutes."""
    asked = headers.get(b"access-control-request-headers", b"authorization, content-type")
    extra = (
        [(b"access-control-allow-private-network", b"true")]
        if b"access-control-request-private-network" in headers
        else []
    )
    await send(
        {
            "type": "http.response.start",
            "status": 204,
            "headers": [
                *_cors_headers(origin),
                (b"access-control-allow-methods", _METHODS.encode()),
                (b"access-control-allow-headers", asked),
                (b"access-control-max-age", _PREFLIGHT_MAX_AGE_S.encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})


def _with_cors(send, origin: str):
    """send, with the CORS headers of an allowed origin added to the response's start."""

    async def cors_send(message) -> None:
        if message["type"] == "http.response.start":
            headers = message.get("headers", [])
            vary = b", ".join(v for k, v in headers if k.lower() == b"vary")
            kept = [(k, v) for k, v in headers if k.lower() != b"vary"]
            message = {**message, "headers": [*kept, *_cors_headers(origin, vary)]}
        await send(message)

    return cors_send
