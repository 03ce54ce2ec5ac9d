"""Every name of a model resolves on every route (server/names.py, pool.py, catalog.py): Ollama's
`name:tag` and `name` for `:latest`, a file's name and stem, and the names other stores give the
same file; in one-model and many-model mode alike. /api/tags and /v1/models list each model once,
with its names."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from draftwise.server import catalog, create_app
from draftwise.server.app import create_pool_app
from draftwise.server.names import spellings
from draftwise.server.pool import ModelSource
from tests.server.conftest import LiveServer
from tests.server.test_models_pool import GIB, Loads, toy_engine

CHAT = [{"role": "user", "content": "Hi"}]
# Each route that holds a model, with a body it accepts (model filled in).
ROUTES = [
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1}),
    ("/v1/responses", {"input": "x", "max_output_tokens": 1}),
    ("/v1/messages", {"messages": CHAT, "max_tokens": 1}),
    ("/v1/messages/count_tokens", {"messages": CHAT}),
    ("/api/chat", {"messages": CHAT, "stream": False, "options": {"num_predict": 1}}),
    ("/api/generate", {"prompt": "x", "stream": False, "options": {"num_predict": 1}}),
    ("/tokenize", {"content": "x"}),
]
NAMES = ["alpha.gguf", "alpha.gguf:latest", "alpha", "alpha:latest", "smollm2:135m", "smollm2-135m-instruct"]


def test_spellings_of_a_file_and_of_ollamas_names():
    assert spellings("sub/alpha.gguf") == (
        "sub/alpha.gguf:latest",
        "alpha.gguf",
        "alpha.gguf:latest",
        "alpha",
        "alpha:latest",
    )
    assert spellings("qwen2.5-coder:7b") == ()
    assert spellings("m:latest") == ("m",)
    assert spellings("user/m") == ("user/m:latest",)


def ask_everywhere(live, names) -> dict:
    """name -> the routes that did not answer 200."""
    failed = {}
    for name in names:
        for path, body in ROUTES:
            reply = httpx.post(f"{live.url}{path}", json={"model": name, **body}, timeout=30)
            if reply.status_code != 200:
                failed.setdefault(name, []).append((path, reply.status_code, reply.text[:200]))
    return failed


def test_every_name_resolves_on_every_route_of_a_pool():
    loads = Loads()
    alpha = ModelSource(
        "alpha.gguf",
        loads.source("alpha.gguf", 1).load,
        memory_bytes=GIB,
        aliases=("smollm2:135m", "smollm2-135m-instruct"),
    )
    with LiveServer(None, app=create_pool_app([loads.source("other", 2), alpha])) as live:
        assert ask_everywhere(live, NAMES) == {}
        assert loads.count == {"alpha.gguf": 1}
        cards = httpx.get(f"{live.url}/v1/models", timeout=30).json()["data"]
        assert [c["id"] for c in cards] == ["other", "alpha.gguf"]
        assert set(NAMES) - {"alpha.gguf"} <= set(cards[1]["aliases"])
        tags = httpx.get(f"{live.url}/api/tags", timeout=30).json()["models"]
        assert [t["name"] for t in tags] == ["other:latest", "alpha.gguf:latest"]
        assert "smollm2:135m" in tags[1]["aliases"]
        card = httpx.get(f"{live.url}/v1/models/smollm2:135m", timeout=30)
        assert card.status_code == 200 and card.json()["id"] == "alpha.gguf"
        assert httpx.get(f"{live.url}/v1/models/nope", timeout=30).status_code == 404


def test_every_spelling_resolves_on_every_route_of_one_model():
    engine = toy_engine(1)
    with LiveServer(engine, app=create_app(engine, "alpha.gguf")) as live:
        assert ask_everywhere(live, NAMES[:4]) == {}
        assert httpx.post(f"{live.url}/v1/completions", json={"model": "beta", "prompt": "x"}).status_code == 404


def test_a_name_two_models_share_is_neithers():
    loads = Loads()
    a = ModelSource("one/model.gguf", loads.source("a", 1).load, memory_bytes=GIB)
    b = ModelSource("two/model.gguf", loads.source("b", 2).load, memory_bytes=GIB)
    with LiveServer(None, app=create_pool_app([a, b])) as live:
        reply = httpx.post(f"{live.url}/v1/completions", json={"model": "model", "prompt": "x"}, timeout=30)
        assert reply.status_code == 404
        ok = httpx.post(f"{live.url}/v1/completions", json={"model": "two/model.gguf", "prompt": "x", "max_tokens": 1})
        assert ok.status_code == 200 and loads.count == {"b": 1}


def two_stores(tiny_gguf_dir, tmp_path, monkeypatch):
    """An Ollama store holding smollm2:135m, whose blob is also (a hard link) the file
    smollm2-135m-instruct.gguf of a models folder; the folder."""
    home = tmp_path / "home"
    ollama = home / ".ollama" / "models"
    (ollama / "blobs").mkdir(parents=True)
    digest = "ab" * 32
    blob = ollama / "blobs" / f"sha256-{digest}"
    blob.write_bytes((tiny_gguf_dir / "target.gguf").read_bytes())
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    manifest.parent.mkdir(parents=True)
    layer = {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": 1}
    manifest.write_text(json.dumps({"layers": [layer]}))
    folder = tmp_path / "models"
    folder.mkdir()
    os.link(blob, folder / "smollm2-135m-instruct.gguf")
    for key in ("OLLAMA_MODELS", "HF_HOME", "HF_HUB_CACHE", "LLAMA_CACHE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    return folder


def test_a_file_two_stores_hold_is_served_once_with_both_names(tiny_gguf_dir, tmp_path, monkeypatch):
    """An Ollama blob that is also a file in a models folder (a hard link): one model, served under
    the folder's name, answering to Ollama's `smollm2:135m` too (not `smollm2`: that is
    `smollm2:latest`, another model)."""
    folder = two_stores(tiny_gguf_dir, tmp_path, monkeypatch)
    served = catalog.chosen("all", str(folder / "smollm2-135m-instruct.gguf"), [folder])
    assert [s.name for s in served] == ["smollm2-135m-instruct.gguf"]
    assert "smollm2:135m" in served[0].aliases
    sources = catalog.sources(served, lambda spec: toy_engine(1), n_ctx=256, num_slots=1)
    with LiveServer(None, app=create_pool_app(sources)) as live:
        assert ask_everywhere(live, ["smollm2:135m", "smollm2-135m-instruct"]) == {}
        reply = httpx.post(f"{live.url}/v1/completions", json={"model": "smollm2", "prompt": "x"}, timeout=30)
        assert reply.status_code == 404
        tags = httpx.get(f"{live.url}/api/tags", timeout=30).json()["models"]
        assert len(tags) == 1 and "smollm2:135m" in tags[0]["aliases"]


def test_one_model_answers_to_the_other_stores_names_too(tiny_gguf_dir, tmp_path, monkeypatch):
    folder = two_stores(tiny_gguf_dir, tmp_path, monkeypatch)
    path = folder / "smollm2-135m-instruct.gguf"
    names = catalog.other_names(path.name, path, [folder])
    assert "smollm2:135m" in names and path.name not in names
    engine = toy_engine(1)
    with LiveServer(engine, app=create_app(engine, path.name, names=names)) as live:
        assert (
            ask_everywhere(live, ["smollm2:135m", "smollm2-135m-instruct", "smollm2-135m-instruct.gguf:latest"]) == {}
        )
        assert "smollm2:135m" in httpx.get(f"{live.url}/v1/models", timeout=30).json()["data"][0]["aliases"]


def test_a_registry_model_and_its_ollama_blob_are_one_model(tmp_path):
    from draftwise import models

    name, spec = next(iter(models.REGISTRY.items()))
    blob = tmp_path / f"sha256-{spec.sha256}"
    assert catalog._identities(name, tmp_path / "elsewhere.gguf") & catalog._identities("x:latest", blob)


@pytest.mark.parametrize("name", ["alpha", "alpha:latest", "smollm2"])
def test_the_pool_resolves_each_name_to_its_model(name):
    loads = Loads()
    alpha = ModelSource("alpha.gguf", loads.source("alpha.gguf", 1).load, aliases=("smollm2:latest",))
    pool = catalog_pool([alpha, loads.source("b", 2)])
    assert pool.resolve(name) == "alpha.gguf"


def catalog_pool(sources):
    from tests.server.test_models_pool import make_pool

    return make_pool(sources)


def test_two_stores_files_of_one_name_are_both_served(tiny_gguf_dir, tmp_path, monkeypatch):
    """Two folders each holding a different model.gguf: the second is served under its path (the
    server starts), and the shared stem "model" is neither's."""
    import shutil

    one, two = tmp_path / "one", tmp_path / "two"
    for folder, name in ((one, "target.gguf"), (two, "draft.gguf")):
        folder.mkdir()
        shutil.copy(tiny_gguf_dir / name, folder / "model.gguf")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))
    for key in ("OLLAMA_MODELS", "HF_HOME", "HF_HUB_CACHE", "LLAMA_CACHE"):
        monkeypatch.delenv(key, raising=False)
    served = catalog.chosen("all", str(one / "model.gguf"), [one, two])
    assert [s.name for s in served] == ["model.gguf", str(two / "model.gguf")]
    pool = catalog_pool(catalog.sources(served, lambda spec: toy_engine(1), n_ctx=256, num_slots=1))
    assert pool.resolve("model") is None and pool.resolve(str(two / "model.gguf")) == str(two / "model.gguf")
