"""What a request may do to a server of several models (server/model_router.py, pool.py,
keep_alive.py): only a request a route accepts loads a model; keep_alive is read as Ollama reads
it and a refused request changes nothing; /api/show is the same before and after the load; a load
that cannot start evicts nothing; a model that cannot load is no error a client retries without
end; the unknown-model 404 quotes a name and the served names within bounds."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from draftwise.server.app import create_pool_app
from draftwise.server.keep_alive import FOREVER, keep_alive_seconds
from draftwise.server.pool import ModelSource
from tests.server.conftest import LiveServer
from tests.server.test_models_pool import GIB, Loads, make_pool

CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def served():
    """coder and chat:7b (1 GiB each, a budget of two), and bad, which fails to load."""
    loads = Loads()
    sources = [loads.source("coder", 1), loads.source("chat:7b", 2), loads.source("bad", 3, fail="truncated")]
    with LiveServer(None, app=create_pool_app(sources, budget_bytes=2 * GIB)) as live:
        live.loads = loads
        yield live


def post(live, path: str, body, **kw) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{live.url}{path}", content=content, headers={"content-type": "application/json"}, timeout=30)


def loaded(live) -> set[str]:
    reply = httpx.get(f"{live.url}/api/ps", timeout=30)
    assert reply.status_code == 200, reply.text
    return {m["name"] for m in reply.json()["models"]}


# ---------------------------------------------------------------------- keep_alive
@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("99999999h", FOREVER),
        (1e308, FOREVER),
        (253402300799, FOREVER),
        (10**309, FOREVER),
        (-(10**400), FOREVER),
        ("1e400", FOREVER),
        ("-5m", FOREVER),
        ("1.5h", 5400.0),
        (".5s", 0.5),
        ("9000000000", 9e9),  # under Go's longest duration (about 9.2e9 s): kept as it is
    ],
)
def test_a_long_or_negative_keep_alive_is_for_ever(value, seconds):
    assert keep_alive_seconds(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["nan", float("nan"), "inf", "5 m", "h", "", "1h" * 100, True, [1], {}])
def test_what_is_no_duration_is_refused(value):
    assert keep_alive_seconds(value) is None


def test_the_serve_option_takes_a_long_keep_alive():
    from draftwise.cli.serve import _keep_alive

    assert _keep_alive("99999999h") == FOREVER


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/api/generate", {"prompt": "x", "stream": False, "options": {"num_predict": 1}}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 1}),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1}),
        ("/v1/messages", {"messages": CHAT, "max_tokens": 1}),
        ("/infill", {"input_prefix": "a", "input_suffix": "b", "n_predict": 1}),  # the toy has no FIM: a 400
    ],
)
@pytest.mark.parametrize("keep_alive", ["99999999h", "1e308", "253402300799", "10**309"])
def test_a_huge_keep_alive_leaves_api_ps_answering(served, path, extra, keep_alive):
    """The probe's request (and the same field on every protocol's body), then /api/ps: 200, the
    model kept with a far-future expires_at."""
    value = keep_alive if keep_alive != "10**309" else None
    body = json.dumps({"model": "coder", **extra, "keep_alive": value}).encode()
    if value is None:  # an integer json.dumps would write exactly, past any float
        body = body.replace(b'"keep_alive": null', b'"keep_alive": 1' + b"0" * 309)
    if keep_alive in ("1e308", "253402300799"):
        body = body.replace(f'"{keep_alive}"'.encode(), keep_alive.encode())  # as a JSON number
    reply = post(served, path, body)
    # /infill: the toy has no FIM; Ollama's keep_alive field takes 64-bit integers (Go's JSON
    # refuses 1e309 too): both refused, their keep_alive not applied
    refused = path == "/infill" or (path.startswith("/api/") and keep_alive == "10**309")
    assert reply.status_code == (400 if refused else 200), reply.text
    ps = httpx.get(f"{served.url}/api/ps", timeout=30)
    assert ps.status_code == 200, ps.text
    far = [model["expires_at"] > "2100" for model in ps.json()["models"]]
    assert far == ([] if refused and path != "/infill" else [not refused])


def test_a_keep_alive_that_is_no_duration_is_a_400_on_every_route(served):
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/messages", "/api/chat"):
        reply = post(
            served, path, {"model": "coder", "prompt": "x", "messages": CHAT, "max_tokens": 1, "keep_alive": "soon"}
        )
        assert reply.status_code == 400 and "keep_alive" in reply.text, (path, reply.text)
    assert served.loads.count == {}


def test_a_request_refused_after_the_load_leaves_the_keep_alive_as_it_was(served):
    kept = post(served, "/api/generate", {"model": "coder", "prompt": "", "keep_alive": -1, "stream": False})
    assert kept.status_code == 200 and loaded(served) == {"coder:latest"}
    # think asks for reasoning: refused by the route once the model is there; its keep_alive 0 is not applied
    refused = post(served, "/api/generate", {"model": "coder", "prompt": "x", "think": True, "keep_alive": 0})
    assert refused.status_code == 400 and loaded(served) == {"coder:latest"}
    expires = httpx.get(f"{served.url}/api/ps", timeout=30).json()["models"][0]["expires_at"]
    assert expires > "2100"  # still for ever


# ---------------------------------------------------------------------- only an accepted request loads
@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/nonexistent", {"model": "coder", "keep_alive": -1}, 404),
        ("GET", "/favicon.ico", None, 404),
        ("GET", "/api/chat", None, 405),
        ("POST", "/v1/chat/completions", {"model": "coder", "messages": CHAT, "temperature": "hot"}, 400),
        ("POST", "/api/chat", {"model": "coder", "messages": "hi", "keep_alive": -1}, 400),
        ("POST", "/v1/messages", {"model": "coder", "messages": CHAT}, 400),  # no max_tokens
        ("POST", "/v1/completions", b'{"model": "coder", "prompt": ', 400),
        ("POST", "/v1/completions", b"", 400),
        ("POST", "/v1/chat/completions/", {"model": "coder", "messages": CHAT}, 307),  # a redirect
    ],
)
def test_a_request_no_route_accepts_loads_nothing(served, method, path, body, status):
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    reply = httpx.request(method, f"{served.url}{path}", content=content, timeout=30)
    assert reply.status_code == status, reply.text
    assert served.loads.count == {} and loaded(served) == set()


def test_a_lone_surrogate_in_model_is_the_documented_400(served):
    for path in ("/v1/chat/completions", "/api/chat", "/v1/messages"):
        body = b'{"model": "\\ud800x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}'
        reply = post(served, path, body)
        assert reply.status_code == 400 and "model" in reply.text, (path, reply.text)
    assert served.loads.count == {}


@pytest.mark.parametrize(("path", "empty"), [("/api/generate", {"prompt": ""}), ("/api/chat", {"messages": []})])
def test_an_unload_of_a_model_not_loaded_loads_nothing(served, path, empty):
    for stream in (False, True):
        reply = post(served, path, {"model": "chat:7b", **empty, "keep_alive": 0, "stream": stream})
        assert reply.status_code == 200
        last = json.loads(reply.text.strip().splitlines()[-1])
        assert last["done"] is True and last["done_reason"] == "unload"
    assert served.loads.count == {}
    post(served, path, {"model": "chat:7b", **empty, "stream": False})  # Ollama's load request
    assert loaded(served) == {"chat:7b"}
    reply = post(served, path, {"model": "chat:7b", **empty, "keep_alive": "0s", "stream": False})
    assert reply.json()["done_reason"] == "unload" and loaded(served) == set()
    assert served.loads.count == {"chat:7b": 1}


# ---------------------------------------------------------------------- /api/show, loaded or not
def test_show_is_the_same_before_and_after_the_load():
    loads = Loads()
    details = {"format": "gguf", "family": "qwen2", "capabilities": ["completion", "tools"], "context_length": 512}
    source = ModelSource("q", loads.source("q", 1).load, memory_bytes=GIB, details=details)
    with LiveServer(None, app=create_pool_app([source])) as live:
        before = post(live, "/api/show", {"model": "q"}).json()
        assert post(live, "/api/generate", {"model": "q", "prompt": "", "stream": False}).status_code == 200
        assert loaded(live) == {"q:latest"}
        after = post(live, "/api/show", {"model": "q:latest"}).json()
    assert before == after
    assert after["details"]["family"] == "qwen2" and after["capabilities"] == ["completion", "tools"]
    assert after["model_info"]["general.architecture"] == "qwen2"


# ---------------------------------------------------------------------- loads that cannot start
def test_a_load_that_cannot_start_evicts_nothing(tmp_path):
    """b's file is deleted after the server started: its requests fail by name, and a, loaded and
    idle under a budget of one model, stays."""
    from draftwise.server.catalog import _present

    loads = Loads()
    gone = tmp_path / "b.gguf"
    gone.write_bytes(b"GGUF")
    b = loads.source("b", 2)
    sources = [loads.source("a", 1), ModelSource("b", b.load, memory_bytes=GIB, check=_present(gone))]
    pool = make_pool(sources, budget_bytes=GIB)
    gone.unlink()

    async def main():
        async with pool.use("a"):
            pass
        with pytest.raises(Exception, match="b.gguf: cannot be read"):
            async with pool.use("b"):
                pass
        return [m.name for m in pool.loaded()]

    assert asyncio.run(main()) == ["a"]
    assert loads.count == {"a": 1}
    pool.close()


def test_a_negative_estimate_lets_no_model_past_the_budget():
    loads = Loads()
    sources = [loads.source("neg", 0, memory=-(2**62)), *(loads.source(n, i) for i, n in enumerate("abc", 1))]
    pool = make_pool(sources, budget_bytes=2 * GIB)

    async def main():
        held = []
        for name in ["neg", "a", "b", "c", "neg", "a"]:
            async with pool.use(name):
                held.append(sum(1 for m in pool.loaded() if m.name != "neg"))
        return held

    assert max(asyncio.run(main())) <= 2  # models of 1 GiB within 2 GiB, neg loaded or not
    pool.close()


# ---------------------------------------------------------------------- the errors' shape and size
def test_a_model_that_cannot_load_is_no_overloaded_error(served):
    reply = post(served, "/v1/messages", {"model": "bad", "messages": CHAT, "max_tokens": 1})
    assert reply.status_code == 500 and reply.json()["error"]["type"] == "api_error", reply.text
    assert "truncated" in reply.json()["error"]["message"]
    assert reply.headers["x-should-retry"] == "false"
    openai = post(served, "/v1/completions", {"model": "bad", "prompt": "x", "max_tokens": 1})
    assert openai.status_code == 503 and openai.json()["error"]["code"] == "model_unavailable"
    assert openai.headers["x-should-retry"] == "false"


def test_the_unknown_model_404_quotes_and_lists_within_bounds():
    loads = Loads()
    sources = [loads.source(f"m{i}", i) for i in range(30)]
    with LiveServer(None, app=create_pool_app(sources)) as live:
        long_name = "x" * 100_000
        for path in ("/v1/completions", "/api/generate", "/v1/messages", "/api/show"):
            reply = post(live, path, {"model": long_name, "prompt": "x", "messages": CHAT, "max_tokens": 1})
            assert reply.status_code == 404, reply.text
            assert len(reply.content) < 1000 and "100000 characters" in reply.text and "and 20 more" in reply.text
        assert loads.count == {}
