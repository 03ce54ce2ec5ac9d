"""Fuzz of every route of every protocol: no request, valid or not, gets a 5xx; every 4xx is in
the route's protocol's own error shape; the server answers a normal request after each batch.

- /openapi.json describes every route with its request body (checked first), and schemathesis
  sends valid and invalid requests to each route of that document.
- What no schema can type, written as raw JSON text (fuzz_bodies.py): non-finite numbers,
  integers beyond 64 bits and lone surrogates (and a value of each JSON type), at every field
  (and in every key) of a valid request per route, a case per field; then hypothesis
  strategies (fuzz_bodies.RAW_JSON) for more of the same at fields drawn at random.

The engine is the toy engine with a 64-token context, so every request stays cheap.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

from draftwise.fim import FimTokens
from draftwise.server import create_app
from tests.server.conftest import MODEL, LiveServer, make_engine
from tests.server.fuzz_bodies import (
    PROBES,
    RAW_JSON,
    RAW_VALUES,
    SURROGATE,
    Probe,
    answer_problem,
    case_id,
    lone_surrogate_key,
    paths,
    raw_body,
)

MAX_EXAMPLES = 30  # per route and method: bounded so CI stays fast
HYPOTHESIS_EXAMPLES = 60  # per base request
PAGE_PATHS = ("/", "/ui/{name}")  # the chat page and its assets: no API, no body

ENGINE = make_engine(n_ctx=64)
APP = create_app(ENGINE, MODEL)
# NOTE: the toy's characters have no FIM tokens, so /infill would stop at its 400; three of its
# characters stand for prefix, suffix and middle here, so that every /infill field reaches generation.
APP.state.server.fim_tokens = FimTokens(prefix=37, suffix=38, middle=39)
# NOTE: the schema comes from the app object itself; the requests go to it over real HTTP
# (schemathesis' pytest fixture loader breaks on pytest 9).
schema = schemathesis.openapi.from_dict(APP.openapi())
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=MAX_EXAMPLES, deterministic=True
)


@pytest.fixture(scope="module")
def fuzz_server():
    with LiveServer(ENGINE, app=APP) as live:
        yield live


@pytest.fixture(scope="module")
def client(fuzz_server):
    """Requests as real clients send them: to the server's own Host, with a JSON Content-Type."""
    host = fuzz_server.url.removeprefix("http://")
    headers = {"Host": host, "Content-Type": "application/json"}
    with httpx.Client(base_url=fuzz_server.url, headers=headers, timeout=30) as http:
        yield http


def send(client: httpx.Client, path: str, content: bytes) -> str | None:
    """POST the raw body; what is wrong with the answer (fuzz_bodies.answer_problem), or None."""
    try:
        r = client.post(path, content=content)
    except httpx.RemoteProtocolError as exc:  # the server closed the connection mid-answer
        return f"the answer broke off: {exc}"
    return answer_problem(path, r.status_code, r.headers.get("content-type", ""), r.content)


def assert_serves(client: httpx.Client, probe: Probe) -> None:
    """The base request still gets its normal answer."""
    r = client.post(probe.path, json=probe.body)
    assert r.status_code == 200, r.text
    assert answer_problem(probe.path, r.status_code, r.headers.get("content-type", ""), r.content) is None


# ---------------------------------------------------------------------- the document
def _leaf_routes(routes):
    """The app's routes, those of included routers too (FastAPI >= 0.16x keeps a router whole)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        yield from _leaf_routes(included.routes) if included is not None else (route,)


def test_every_route_is_in_the_openapi_document_with_its_request_body():
    document = APP.openapi()
    components = document["components"]["schemas"]
    checked = set()
    for route in _leaf_routes(APP.routes):
        if route.path in (*PAGE_PATHS, APP.openapi_url):
            continue
        assert isinstance(route, APIRoute) and route.include_in_schema, route.path
        path = route.path.replace(":path}", "}")
        for method in route.methods - {"HEAD"}:
            operation = document["paths"].get(path, {}).get(method.lower())
            assert operation is not None, f"{method} {path} is not in /openapi.json"
            if method == "POST":  # every POST route takes a JSON body: typed, not read by hand
                assert route.body_field is not None, f"{path} reads its body without a schema"
                ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                assert components[ref.rsplit("/", 1)[-1]]["properties"], path
            else:
                assert "requestBody" not in operation, path
            checked.add(f"{method} {path}")
    assert {f"POST {probe.path}" for probe in PROBES} <= checked
    assert {"GET /api/tags", "GET /v1/models", "DELETE /v1/responses/{response_id}"} <= checked


# ---------------------------------------------------------------------- the judge
@pytest.mark.parametrize(
    ("path", "status", "content_type", "body"),
    [
        ("/v1/completions", 500, "application/json", b'{"error": {"message": "x", "type": "server_error"}}'),
        ("/api/chat", 400, "application/json", b'{"error": {"message": "x", "type": "invalid_request_error"}}'),
        ("/v1/messages", 400, "application/json", b'{"error": {"message": "x", "type": "invalid_request_error"}}'),
        ("/infill", 400, "application/json", b'{"error": "x"}'),
        ("/infill", 200, "text/event-stream", b'data: {"temperature": Infinity}\n\n'),
        ("/api/generate", 200, "application/x-ndjson", b'{"response": "a"}\n{"response": NaN}\n'),
        ("/v1/responses", 200, "text/event-stream", b'data: {"error": {"message": "generation failed: boom"}}\n\n'),
        ("/tokenize", 200, "application/json", b""),
    ],
)
def test_the_judge_refuses_what_no_client_should_get(path, status, content_type, body):
    assert answer_problem(path, status, content_type, body) is not None


def test_the_judge_passes_each_protocols_own_answers():
    anthropic = b'{"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}'
    assert answer_problem("/v1/messages/count_tokens", 400, "application/json", anthropic) is None
    assert answer_problem("/api/show", 404, "application/json", b'{"error": "x"}') is None
    assert answer_problem("/detokenize", 400, "application/json", b'{"error": {"message": "x", "type": "t"}}') is None
    assert answer_problem("/v1/chat/completions", 200, "text/event-stream", b"data: {}\n\ndata: [DONE]\n\n") is None


# ---------------------------------------------------------------------- schemathesis over the document
@schemathesis.check
def protocol_error_shape(ctx, response, case):
    """A 4xx is in the error shape of the route's protocol; a 2xx is strict JSON."""
    problem = answer_problem(
        case.path, response.status_code, response.headers.get("content-type", [""])[0], response.content
    )
    if problem is not None:
        raise AssertionError(problem)


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_route_answers_with_a_server_error(case, fuzz_server):
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = MODEL  # a random name stops at the 404 check; go deeper
    host = fuzz_server.url.removeprefix("http://")
    case.call_and_validate(
        base_url=fuzz_server.url,
        headers={"Host": host, "Content-Type": "application/json"},
        checks=[not_a_server_error, protocol_error_shape],
    )


def test_the_server_still_serves_after_schemathesis(client):
    for probe in PROBES:
        assert_serves(client, probe)


# ---------------------------------------------------------------------- raw JSON at every field
def _fields():
    """(probe, field path) for every field of every probe, each probe's batch ended by
    (probe, None): its base request answered as before."""
    for probe in PROBES:
        for path in paths(probe.body):
            yield pytest.param(probe, path, id=f"{probe.name}-{case_id(path)}")
        yield pytest.param(probe, None, id=f"{probe.name}-normal")


@pytest.mark.parametrize(("probe", "path"), list(_fields()))
def test_a_raw_value_at_any_field_is_refused_in_the_protocols_shape(client, probe, path):
    if path is None:
        assert_serves(client, probe)
        return
    bodies = [raw_body(probe.body, path, raw) for raw in RAW_VALUES.values()]
    if isinstance(path[-1], str):  # a member of an object: its key too
        bodies.append(raw_body(probe.body, path, SURROGATE, key=True))
    problems = [f"{body[:400]!r} -> {problem}" for body in bodies if (problem := send(client, probe.path, body))]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------- hypothesis: more of the same
@pytest.mark.parametrize("probe", PROBES, ids=[probe.name for probe in PROBES])
def test_hypothesis_values_at_any_field_are_refused_in_the_protocols_shape(client, probe):
    @given(path=st.sampled_from(list(paths(probe.body))), raw=RAW_JSON, as_key=st.booleans())
    @settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None, derandomize=True, database=None)
    def one(path, raw, as_key):
        if as_key and isinstance(path[-1], str):  # a member of an object: a surrogate in its key
            body = raw_body(probe.body, path, lone_surrogate_key(raw), key=True)
        else:
            body = raw_body(probe.body, path, raw)
        problem = send(client, probe.path, body)
        assert problem is None, f"{body[:400]!r} -> {problem}"

    one()
    assert_serves(client, probe)
