"""Who may reach the server (server/access.py): Hosts outside the loopback allow-list and pages of
other origins get 403 in each protocol's error shape, a body that is not JSON 415, an allowed
origin its CORS headers; /health tells only the operator of other tenants' activity."""

from __future__ import annotations

import httpx
import pytest

from draftwise.errors import ConfigError
from draftwise.server import create_app
from draftwise.server.access import Access
from tests.server.conftest import API_KEY, MODEL, LiveServer, make_engine

OLLAMA_BODY = {"model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": 2, "temperature": 0}}
OPENAI_BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
ANTHROPIC_BODY = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
ROUTES = [("/api/generate", OLLAMA_BODY), ("/v1/chat/completions", OPENAI_BODY), ("/v1/messages", ANTHROPIC_BODY)]


@pytest.fixture(scope="module")
def local():
    with LiveServer(make_engine(draft_model=False)) as live:
        yield live


def error_message(path: str, reply: httpx.Response) -> str:
    """The error's message, checking the route's protocol shape on the way."""
    body = reply.json()
    if path.startswith("/api/"):
        assert set(body) == {"error"} and isinstance(body["error"], str)  # Ollama's
        return body["error"]
    if path == "/v1/messages":
        assert body["type"] == "error" and set(body["error"]) >= {"type", "message"}  # Anthropic's
        return body["error"]["message"]
    assert set(body["error"]) >= {"message", "type", "param", "code"}  # OpenAI's
    return body["error"]["message"]


def served(live: LiveServer) -> int:
    """Requests the engine has finished, every route's (the server's metrics: a reply is sent after
    its request is counted)."""
    counter = live.app.state.server.metrics.requests
    return sum(int(s.value) for metric in counter.collect() for s in metric.samples if s.name.endswith("_total"))


def test_the_probes_request_is_refused_and_runs_nothing(local):
    """The outside probe's request (a rebinding page's Host and Origin, a text/plain body): 403,
    and no generation starts."""
    before = served(local)
    reply = httpx.post(
        f"{local.url}/api/generate",
        headers={"Host": "evil.example", "Origin": "https://evil.example", "Content-Type": "text/plain"},
        content=b'{"model":"toy-40","prompt":"Hi","stream":false}',
    )
    assert reply.status_code == 403
    assert "evil.example" in error_message("/api/generate", reply)
    assert served(local) == before


@pytest.mark.parametrize(("path", "body"), ROUTES)
@pytest.mark.parametrize("host", ["evil.example", "evil.example:11434", "127.0.0.1.evil.example", "localhost.evil"])
def test_a_host_outside_the_allow_list_gets_403_in_each_protocol(local, path, body, host):
    reply = httpx.post(f"{local.url}{path}", headers={"Host": host}, json=body)
    assert reply.status_code == 403
    assert "--allowed-hosts" in error_message(path, reply)


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "LOCALHOST:8000", "[::1]:8000", "app.localhost", "10.1.2.3"]
)
def test_loopback_names_and_addresses_are_answered(local, host):
    reply = httpx.post(f"{local.url}/v1/chat/completions", headers={"Host": host}, json=OPENAI_BODY)
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_a_page_of_another_origin_gets_403_in_each_protocol(local, path, body):
    """A plain cross-site page (Host fine, Origin foreign), its preflight refused too."""
    reply = httpx.post(f"{local.url}{path}", headers={"Origin": "https://evil.example"}, json=body)
    assert reply.status_code == 403
    assert "--allowed-origins" in error_message(path, reply)
    assert "access-control-allow-origin" not in reply.headers
    preflight = httpx.options(
        f"{local.url}{path}",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers


def test_the_servers_own_page_origin_is_answered(local):
    """The chat page's fetches name the server's own origin."""
    reply = httpx.post(f"{local.url}/v1/chat/completions", headers={"Origin": local.url}, json=OPENAI_BODY)
    assert reply.status_code == 200
    assert "access-control-allow-origin" not in reply.headers  # same-origin: no CORS needed


def test_dns_rebinding_same_origin_is_refused_by_its_host(local):
    """After rebinding, the page's Origin and the Host agree, and name the attacker's domain."""
    reply = httpx.get(
        f"{local.url}/v1/models", headers={"Host": "rebind.example:8000", "Origin": "http://rebind.example:8000"}
    )
    assert reply.status_code == 403


@pytest.mark.parametrize(("path", "body"), ROUTES)
@pytest.mark.parametrize("content_type", ["text/plain", "text/plain;charset=UTF-8", "multipart/form-data; boundary=x"])
def test_a_body_that_is_not_json_gets_415(local, path, body, content_type):
    import json

    before = served(local)
    reply = httpx.post(f"{local.url}{path}", headers={"Content-Type": content_type}, content=json.dumps(body))
    assert reply.status_code == 415
    assert "application/json" in error_message(path, reply)
    assert served(local) == before


def test_curl_d_on_ollamas_routes_is_read_as_json_unless_a_browser_sent_it(local):
    """Ollama's docs write `curl URL -d '{...}'`, which sends application/x-www-form-urlencoded."""
    import json

    form = {"Content-Type": "application/x-www-form-urlencoded"}
    reply = httpx.post(f"{local.url}/api/generate", headers=form, content=json.dumps(OLLAMA_BODY))
    assert reply.status_code == 200 and reply.json()["done"] is True
    from_a_page = httpx.post(
        f"{local.url}/api/generate", headers={**form, "Sec-Fetch-Site": "cross-site"}, content=json.dumps(OLLAMA_BODY)
    )
    assert from_a_page.status_code == 415
    elsewhere = httpx.post(f"{local.url}/v1/chat/completions", headers=form, content=json.dumps(OPENAI_BODY))
    assert elsewhere.status_code == 415


def test_an_allowed_origin_gets_cors_headers_and_its_preflight(local):
    app = create_app(
        make_engine(draft_model=False), MODEL, api_key=API_KEY, access=Access(allowed_origins=("http://localhost:*",))
    )
    with LiveServer(app.state.server.engine, app=app) as live:
        origin = "http://localhost:5173"
        preflight = httpx.options(
            f"{live.url}/v1/chat/completions",
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 204  # before the key check: a preflight carries none
        assert preflight.headers["access-control-allow-origin"] == origin
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert "authorization" in preflight.headers["access-control-allow-headers"]
        auth = {"Authorization": f"Bearer {API_KEY}", "Origin": origin}
        reply = httpx.post(f"{live.url}/v1/chat/completions", headers=auth, json=OPENAI_BODY)
        assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == origin
        assert "Origin" in reply.headers["vary"]
        refused = httpx.post(f"{live.url}/v1/chat/completions", headers={"Origin": origin}, json=OPENAI_BODY)
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == origin  # readable
        other = httpx.post(
            f"{live.url}/v1/chat/completions", headers={**auth, "Origin": "http://localhost.evil:80"}, json=OPENAI_BODY
        )
        assert other.status_code == 403


def test_a_server_bound_elsewhere_checks_the_host_only_when_told():
    engine = make_engine(draft_model=False)
    anywhere = create_app(engine, MODEL, access=Access(bind_host="0.0.0.0"))
    with LiveServer(engine, app=anywhere) as live:
        assert httpx.get(f"{live.url}/v1/models", headers={"Host": "box.example"}).status_code == 200
    listed = create_app(engine, MODEL, access=Access(bind_host="0.0.0.0", allowed_hosts=("*.lan",)))
    with LiveServer(engine, app=listed) as live:
        assert httpx.get(f"{live.url}/v1/models", headers={"Host": "box.lan:8000"}).status_code == 200
        assert httpx.get(f"{live.url}/v1/models", headers={"Host": "box.example"}).status_code == 403


@pytest.mark.parametrize("origin", ["localhost:3000", "https://app.example/path", "ftp//x", ""])
def test_a_malformed_allowed_origin_is_a_config_error(origin):
    with pytest.raises(ConfigError, match="allowed origin"):
        Access(allowed_origins=(origin,))


@pytest.mark.parametrize("host", ["http://box.lan", "box.lan/x", ""])
def test_a_malformed_allowed_host_is_a_config_error(host):
    with pytest.raises(ConfigError, match="allowed host"):
        Access(allowed_hosts=(host,))


def test_health_shows_activity_to_the_operator_only():
    engine = make_engine(draft_model=False)
    with LiveServer(engine) as keyless:
        assert set(httpx.get(f"{keyless.url}/health").json()) >= {"status", "model", "queue_length", "slots"}
    with LiveServer(engine, api_key=API_KEY) as keyed:
        assert httpx.get(f"{keyed.url}/health").json() == {"status": "ok"}
        full = httpx.get(f"{keyed.url}/health", headers={"Authorization": f"Bearer {API_KEY}"}).json()
        assert full["model"] == MODEL and "queue_length" in full and "running" in full
    tenants = create_app(engine, MODEL, api_keys=("sk-a", "sk-b"), metrics_key="sk-ops")
    with LiveServer(engine, app=tenants) as shared:
        assert httpx.get(f"{shared.url}/health", headers={"Authorization": "Bearer sk-a"}).json() == {"status": "ok"}
        ops = httpx.get(f"{shared.url}/health", headers={"Authorization": "Bearer sk-ops"}).json()
        assert ops["slots"] == 1 and ops["active"] == 0


# ---------------------------------------------------------------------- the HTTP edge (RFC 9112 section 3.2)
def raw_status(live: LiveServer, request: bytes) -> int:
    """The status line's code of a request sent byte for byte (httpx always sends one Host)."""
    import socket

    host, port = live.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        head = conn.recv(65536).split(b"\r\n", 1)[0]
    return int(head.split()[1])


BODY = b'{"model":"toy-40","prompt":"Hi","stream":false,"options":{"num_predict":1}}'


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        (b"Host: evil.com\r\nHost: localhost\r\n", 400),
        (b"Host: localhost\r\nHost: localhost\r\n", 400),
        (b"", 400),
        (b"Host: \r\n", 400),
        (b"Host: localhost\r\n", 200),
    ],
)
@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_duplicate_or_missing_host_headers_are_a_400(headers, status, http):
    """RFC 9112 asks for a 400 for several Host headers and for none (or an empty one) on HTTP/1.1;
    the probe's request (evil.com, then localhost) was answered with a generation."""
    if http == "httptools":
        pytest.importorskip("httptools")
    engine = make_engine(draft_model=False)
    with LiveServer(engine, http=http) as live:
        request = (
            b"POST /api/generate HTTP/1.1\r\n" + headers + b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(BODY), BODY)
        )
        assert raw_status(live, request) == status


def test_http_1_0_without_a_host_is_answered(local):
    assert raw_status(local, b"GET /health HTTP/1.0\r\n\r\n") == 200


def test_a_websocket_is_refused_before_any_route():
    """No route takes a WebSocket, and neither guard checks one: both refuse it at the handshake."""
    import asyncio

    from draftwise.server.access import AccessGuard
    from draftwise.server.errors import Guard

    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    async def receive():
        return {"type": "websocket.connect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "websocket", "path": "/v1/chat/completions", "headers": [(b"host", b"evil.example")]}
    for guard in (AccessGuard(app, access=Access(), reply=None), Guard(app, api_keys=("k",), reply=None)):
        asyncio.run(guard(scope, receive, send))
    assert reached == [] and [m["type"] for m in sent] == ["websocket.close", "websocket.close"]


@pytest.mark.parametrize(
    ("pattern", "origin", "allowed"),
    [
        ("http://localhost:*", "http://localhost:3000", True),
        ("http://localhost:*", "http://localhost:3000.evil.com", False),
        ("http://localhost:*", "http://localhost:3000@evil.com", False),
        ("http://localhost:*", "http://localhost:", False),
        ("http://localhost:*", "http://localhost", False),
        ("https://*.example.com", "https://app.example.com", True),
        ("https://*.example.com", "https://evil.com/.example.com", False),
        ("https://*.example.com", "https://evil.com:1.example.com", False),
        ("http://[::1]:*", "http://[::1]:5173", True),
        ("chrome-extension://*", "chrome-extension://abcdef", True),
        ("null", "null", True),
    ],
)
def test_an_origin_wildcard_matches_within_its_own_part(pattern, origin, allowed):
    assert Access(allowed_origins=(pattern,)).origin_allowed(origin, "127.0.0.1:8000") is allowed
