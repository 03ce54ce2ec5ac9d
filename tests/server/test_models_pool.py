"""Several models behind one server (server/pool.py, model_router.py): loaded when a request names
one, once however many ask together, kept for their keep-alive, the least recently used idle one
unloaded when the next would not fit the budget; every protocol routed by `model`; each answer
the one the same model gives served alone."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import ollama
import openai
import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.drafters import NgramDrafter
from draftwise.engine import Engine
from draftwise.server import create_app
from draftwise.server.app import create_pool_app, model_state
from draftwise.server.pool import ModelPool, ModelSource, ModelUnavailable
from draftwise.types import SpeculationConfig
from tests.server.conftest import LiveServer

GIB = 2**30


def toy_engine(seed: int, delay_s: float = 0.0) -> Engine:
    """A toy model of its own (seed): greedy answers differ between seeds."""
    model = ToyModel(vocab_size=40, sharpness=3, seed=seed)
    logits = model.logits
    if delay_s:

        def logits(context, _model=model):
            time.sleep(delay_s)
            return _model.logits(context)

    target = ToyBackend(logits_fn=logits, vocab_size=40, n_ctx=512, name=f"toy-{seed}")
    return Engine(target, [NgramDrafter(2, 4)], speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4))


class Loads:
    """Load functions that count their calls (and may be slow, or fail)."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.lock = threading.Lock()

    def source(self, name: str, seed: int, memory: int = GIB, load_s: float = 0.0, fail: str = "", **kw):
        def load() -> Engine:
            with self.lock:
                self.count[name] = self.count.get(name, 0) + 1
            time.sleep(load_s)
            if fail:
                raise ValueError(fail)
            return toy_engine(seed, **kw)

        return ModelSource(name, load, memory_bytes=memory, size_bytes=memory // 2, details={"family": "toy"})


def make_pool(sources, **kw) -> ModelPool:
    return ModelPool(sources, lambda name, engine: model_state(name, engine), **kw)


# ---------------------------------------------------------------------- the pool alone
def test_concurrent_first_requests_load_a_model_once():
    loads = Loads()
    pool = make_pool([loads.source("a", 1, load_s=0.3)])

    async def ask():
        async with pool.use("a") as state:
            return state

    async def main():
        return await asyncio.gather(*(ask() for _ in range(5)))

    states = asyncio.run(main())
    assert loads.count == {"a": 1} and all(s is states[0] for s in states)
    pool.close()


def test_the_least_recently_used_idle_model_makes_room():
    loads = Loads()
    pool = make_pool([loads.source(n, i) for i, n in enumerate("abc")], budget_bytes=2 * GIB)

    async def main():
        for name in "abac":  # a and b fit; c needs room: b is the least recently used
            async with pool.use(name):
                pass
        return sorted(m.name for m in pool.loaded())

    assert asyncio.run(main()) == ["a", "c"]
    pool.close()


def test_a_busy_model_is_unloaded_only_after_its_requests():
    loads = Loads()
    pool = make_pool([loads.source("a", 1), loads.source("b", 2)], budget_bytes=GIB)
    order = []

    async def hold_a():
        async with pool.use("a"):
            order.append("a starts")
            await asyncio.sleep(0.3)
            order.append("a ends")

    async def want_b():
        await asyncio.sleep(0.05)
        async with pool.use("b"):
            order.append("b starts")

    async def main():
        await asyncio.gather(hold_a(), want_b())
        return [m.name for m in pool.loaded()]

    assert asyncio.run(main()) == ["b"]
    assert order == ["a starts", "a ends", "b starts"]
    pool.close()


def test_keep_alive_zero_unloads_at_once_and_a_duration_expires():
    loads = Loads()
    pool = make_pool([loads.source("a", 1), loads.source("b", 2)], keep_alive_s=0.2)

    async def main():
        pool.start()
        async with pool.use("a", keep_alive_s=0):
            pass
        after_zero = [m.name for m in pool.loaded()]
        async with pool.use("b"):
            pass
        kept = [m.name for m in pool.loaded()]
        await asyncio.sleep(0.6)
        return after_zero, kept, [m.name for m in pool.loaded()]

    assert asyncio.run(main()) == ([], ["b"], [])
    pool.close()


def test_a_model_that_fails_to_load_fails_its_requests_only():
    loads = Loads()
    pool = make_pool([loads.source("good", 1), loads.source("bad", 2, fail="not a GGUF file: bad.gguf")])

    async def main():
        with pytest.raises(ModelUnavailable, match="'bad' could not be loaded: not a GGUF file: bad.gguf"):
            async with pool.use("bad"):
                pass
        async with pool.use("good") as state:
            return state.model_name

    assert asyncio.run(main()) == "good"
    pool.close()


def test_a_model_larger_than_the_budget_is_refused_by_name():
    pool = make_pool([Loads().source("huge", 1, memory=8 * GIB)], budget_bytes=4 * GIB)

    async def main():
        async with pool.use("huge"):
            pass

    with pytest.raises(ModelUnavailable, match="'huge' needs about 8.0 GiB, more than the server's memory budget"):
        asyncio.run(main())


def test_names_resolve_with_and_without_ollamas_tag():
    pool = make_pool([Loads().source("a", 1), Loads().source("qwen:7b", 2)])
    assert pool.resolve("a:latest") == "a" and pool.resolve("qwen:7b") == "qwen:7b"
    assert pool.resolve(None) == "a" and pool.resolve("other") is None


# ---------------------------------------------------------------------- through the server
CHAT = [{"role": "user", "content": "Hi"}]


def alone(seed: int, name: str) -> str:
    """The greedy answer of the model served alone."""
    with LiveServer(toy_engine(seed), app=create_app(toy_engine(seed), name)) as live:
        reply = httpx.post(
            f"{live.url}/v1/chat/completions",
            json={"model": name, "messages": CHAT, "max_tokens": 12, "temperature": 0},
            timeout=30,
        )
        return reply.json()["choices"][0]["message"]["content"]


@pytest.fixture
def pooled():
    loads = Loads()
    sources = [
        loads.source("coder", 1),
        loads.source("chat:7b", 2, load_s=0.5),
        loads.source("bad", 3, fail="truncated"),
    ]
    app = create_pool_app(sources, budget_bytes=2 * GIB)
    with LiveServer(None, app=app) as live:
        live.loads = loads
        yield live


def test_switching_models_with_the_openai_and_ollama_clients(pooled):
    expected = {"coder": alone(1, "coder"), "chat:7b": alone(2, "chat:7b")}
    assert expected["coder"] != expected["chat:7b"]
    client = openai.OpenAI(base_url=f"{pooled.url}/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list()] == ["coder", "chat:7b", "bad"]
    assert pooled.loads.count == {}  # listing loads nothing
    ol = ollama.Client(host=pooled.url)
    for name in ["coder", "chat:7b", "coder", "chat:7b"]:
        a = client.chat.completions.create(model=name, messages=CHAT, max_tokens=12, temperature=0)
        assert a.choices[0].message.content == expected[name]
        b = ol.chat(model=name, messages=CHAT, options={"num_predict": 12, "temperature": 0})
        assert b.message.content == expected[name]
    assert pooled.loads.count == {"coder": 1, "chat:7b": 1}  # each loaded once: both fit
    assert {m.model for m in ol.ps().models} == {"coder:latest", "chat:7b"}
    assert {m.model for m in ol.list().models} == {"coder:latest", "chat:7b", "bad:latest"}
    ol.generate(model="coder", prompt="", keep_alive=0)  # Ollama's way to unload a model
    assert {m.model for m in ol.ps().models} == {"chat:7b"}


def test_an_unknown_model_is_a_404_and_a_broken_one_fails_alone(pooled):
    client = openai.OpenAI(base_url=f"{pooled.url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.chat.completions.create(model="nope", messages=CHAT, max_tokens=4)
    with pytest.raises(ollama.ResponseError, match="could not be loaded: truncated"):
        ollama.Client(host=pooled.url).chat(model="bad", messages=CHAT)
    reply = client.chat.completions.create(model="coder", messages=CHAT, max_tokens=4, temperature=0)
    assert reply.choices[0].finish_reason == "length"


def test_a_load_leaves_other_streams_undisturbed(pooled):
    expected = alone(1, "coder")
    client = openai.OpenAI(base_url=f"{pooled.url}/v1", api_key="none", max_retries=0)
    client.chat.completions.create(model="coder", messages=CHAT, max_tokens=1)  # loaded
    pieces, loaded = [], []

    def stream():
        chunks = client.chat.completions.create(model="coder", messages=CHAT, max_tokens=12, temperature=0, stream=True)
        pieces.extend(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def load():  # chat:7b takes 0.5 s to load
        loaded.append(client.chat.completions.create(model="chat:7b", messages=CHAT, max_tokens=2).model)

    threads = [threading.Thread(target=stream), threading.Thread(target=load)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert "".join(pieces) == expected and loaded == ["chat:7b"]


def test_metrics_and_health_name_each_loaded_model(pooled):
    httpx.post(f"{pooled.url}/v1/completions", json={"model": "coder", "prompt": "x", "max_tokens": 2}, timeout=30)
    metrics = httpx.get(f"{pooled.url}/metrics").text
    assert 'draftwise_generated_tokens_total{served_model="coder"} 2.0' in metrics
    health = httpx.get(f"{pooled.url}/health").json()
    assert health["models"] == ["coder"] and health["model"] == "coder"


def test_show_tells_of_a_model_without_loading_it(pooled):
    ol = ollama.Client(host=pooled.url)
    shown = ol.show("chat:7b")
    assert shown.details.family == "toy" and pooled.loads.count == {}
    with pytest.raises(ollama.ResponseError, match="not found; this server serves coder:latest, chat:7b"):
        ol.show("nope")


# ---------------------------------------------------------------------- llama.cpp models of a folder
def test_gguf_models_of_a_folder_answer_as_each_does_alone(tiny_gguf_dir, tmp_path):
    """Tiny GGUFs (two models, and a truncated file) served together: the answers switching back
    and forth through the openai and ollama clients are each model's own, served alone; the
    truncated file fails its requests by name and the others go on."""
    pytest.importorskip("llama_cpp")
    import shutil

    from draftwise.loading import LoadOptions, load_engine
    from draftwise.server import catalog

    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("target.gguf", "draft.gguf"):
        shutil.copy(tiny_gguf_dir / name, folder / name)
    (folder / "broken.gguf").write_bytes((tiny_gguf_dir / "draft.gguf").read_bytes()[:5000])
    options = LoadOptions(n_ctx=256, threads=1, slots=1)
    speculation = SpeculationConfig(policy="fixed", max_draft_tokens=3)

    def load(spec: str) -> Engine:
        return load_engine(spec, "ngram", options=options, speculation=speculation)

    served = catalog.chosen(str(folder), str(folder / "target.gguf"))
    assert [s.name for s in served][0] == "target.gguf" and len(served) == 3
    prompt = "def add(a, b):"
    expected = {}
    for name in ("target.gguf", "draft.gguf"):
        engine = load(str(folder / name))
        with LiveServer(engine, app=create_app(engine, name)) as live:
            body = {"model": name, "prompt": prompt, "max_tokens": 10, "temperature": 0}
            expected[name] = httpx.post(f"{live.url}/v1/completions", json=body, timeout=60).json()["choices"][0][
                "text"
            ]
    assert expected["target.gguf"] != expected["draft.gguf"]
    app = create_pool_app(catalog.sources(served, load, n_ctx=256, num_slots=1))
    with LiveServer(None, app=app) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
        ol = ollama.Client(host=live.url)
        for name in ("target.gguf", "draft.gguf", "target.gguf", "draft.gguf"):
            text = client.completions.create(model=name, prompt=prompt, max_tokens=10, temperature=0).choices[0].text
            assert text == expected[name]
            raw = ol.generate(model=name, prompt=prompt, raw=True, options={"num_predict": 10, "temperature": 0})
            assert raw.response == expected[name]
        with pytest.raises(ollama.ResponseError, match="broken.gguf"):
            ol.generate(model="broken.gguf", prompt=prompt)
        assert client.completions.create(model="target.gguf", prompt=prompt, max_tokens=2).choices[0].text


@pytest.mark.parametrize("keep_alive", ["banana", "nan", "5 m", True, [1]])
def test_a_keep_alive_that_is_no_duration_is_a_400(pooled, keep_alive):
    body = {"model": "coder", "prompt": "x", "stream": False, "keep_alive": keep_alive}
    reply = httpx.post(f"{pooled.url}/api/generate", json=body, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"].startswith("keep_alive: give a duration")
    assert pooled.loads.count == {}


@pytest.mark.parametrize(
    ("text", "seconds"), [("5m", 300.0), ("1h30m", 5400.0), ("-1", -1.0), (0, 0.0), ("300ms", 0.3), (12.5, 12.5)]
)
def test_keep_alive_durations_read_as_ollama_writes_them(text, seconds):
    from draftwise.server.model_router import keep_alive_seconds

    assert keep_alive_seconds(text) == pytest.approx(seconds)


RAW_VALUES = ["1e400", "NaN", '"\\ud800x"', str(2**70), "[]", "{}", "null", "true", '"x" ']
ROUTED = [
    "/v1/chat/completions",
    "/v1/completions",
    "/api/generate",
    "/api/chat",
    "/api/show",
    "/v1/messages",
    "/infill",
]


@pytest.mark.parametrize("path", ROUTED)
def test_the_router_answers_any_model_and_keep_alive_without_a_5xx(pooled, path):
    """What the router reads itself (`model`, `keep_alive`), as raw JSON a fuzz would send."""
    for field in ("model", "keep_alive", "name"):
        for value in RAW_VALUES:
            others = '"model": "coder", ' if field != "model" else ""
            body = f'{{{others}"{field}": {value}, "prompt": "x", "messages": [], "max_tokens": 1}}'
            reply = httpx.post(
                f"{pooled.url}{path}", content=body.encode(), headers={"content-type": "application/json"}, timeout=30
            )
            assert reply.status_code < 500, (field, value, reply.text)
    ok = httpx.post(f"{pooled.url}/v1/completions", json={"model": "coder", "prompt": "x", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200
