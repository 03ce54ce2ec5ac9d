"""The chat page at `/` (server/web/: index.html, app.js, style.css, shipped as package data) and
`/`'s answer to everyone else: "Ollama is running", what Ollama's CLI and clients check for.

GET / answers the page when the request's Accept names text/html (a browser's navigation), and
Ollama's text otherwise (HEAD /, curl, Ollama's clients). The page and its assets hold no data, so
the Guard lets them through without a key (a browser's navigation cannot send one); every request
the page makes is to the API routes of the same origin with the key typed into it. Their
Content-Security-Policy lets the page load and fetch from this origin only.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from draftwise.server.errors import APIError

OLLAMA_RUNNING = "Ollama is running"
ASSET_PREFIX = "/ui/"
ASSETS = {  # the files under /ui/, by name, and their content types
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter()


def wants_page(method: str, accept: str) -> bool:
    """Whether a request for `/` gets the page: a GET whose Accept names text/html."""
    return method == "GET" and "text/html" in accept.lower()


def is_public(method: str, path: str, accept: str) -> bool:
    """Whether the Guard lets a request through without a key: the page and its assets."""
    if path == "/":
        return wants_page(method, accept)
    return method == "GET" and path.startswith(ASSET_PREFIX) and path[len(ASSET_PREFIX) :] in ASSETS


def _read(name: str) -> bytes:
    return (files("draftwise.server") / "web" / name).read_bytes()


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
def root(request: Request) -> Response:
    if wants_page(request.method, request.headers.get("accept", "")):
        return Response(_read("index.html"), media_type="text/html; charset=utf-8", headers=_headers())
    return PlainTextResponse(OLLAMA_RUNNING, headers={"Vary": "Accept"})


@router.get(ASSET_PREFIX + "{name}", include_in_schema=False)
def asset(name: str) -> Response:
    if name not in ASSETS:
        raise APIError(404, f"no page asset {name!r}", code="not_found")
    return Response(_read(name), media_type=ASSETS[name], headers=PAGE_HEADERS)


def _headers() -> dict[str, str]:
    return {**PAGE_HEADERS, "Vary": "Accept"}
