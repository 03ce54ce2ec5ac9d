"""A many-model soak (issue 67): three tiny GGUF models behind one server with a memory budget of
two, clients switching between them by every name they answer to, streams cancelled halfway,
Ollama's load and unload requests, refused and unknown requests, for a fixed time. Nothing
answers 5xx, /api/ps keeps answering, and the server's log is still written at the end (loads in
parallel threads once sent descriptors 1 and 2 to /dev/null for good)."""

from __future__ import annotations

import os
import random
import shutil
import threading
import time

import httpx
import pytest

from draftwise.server.app import create_pool_app
from draftwise.types import SpeculationConfig
from tests.server.conftest import LiveServer

SOAK_S = 12.0
NUM_CLIENTS = 4
CHAT = [{"role": "user", "content": "Hi"}]


def requests_for(name: str, rng: random.Random) -> tuple[str, str, dict | None, bool]:
    """(method, path, body, streamed-and-cancelled) of one request a client sends."""
    choice = rng.randrange(10)
    if choice == 0:
        return "POST", "/api/generate", {"model": name, "prompt": "", "keep_alive": 0, "stream": False}, False
    if choice == 1:
        return "GET", "/api/ps", None, False
    if choice == 2:
        return "POST", "/v1/chat/completions", {"model": name, "messages": CHAT, "max_tokens": 24, "stream": True}, True
    if choice == 3:
        keep = rng.choice(["-1", "99999999h", "1s", 0, 1e308])
        return "POST", "/api/generate", {"model": name, "prompt": "", "keep_alive": keep, "stream": False}, False
    if choice == 4:
        return "POST", "/v1/completions", {"model": "nope", "prompt": "x"}, False
    if choice == 5:
        return "POST", "/api/show", {"model": name}, False
    if choice == 6:
        return "POST", "/v1/messages", {"model": name, "messages": CHAT, "max_tokens": 3}, False
    if choice == 7:
        return "GET", "/favicon.ico", None, False
    body = {"model": name, "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0}
    return "POST", "/v1/completions", body, False


def client(url: str, names: list[str], seed: int, deadline: float, statuses: list[int], failures: list[str]) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=60) as http:
        while time.monotonic() < deadline:
            method, path, body, cancelled = requests_for(rng.choice(names), rng)
            try:
                if cancelled:  # read the first event, then leave
                    with http.stream(method, path, json=body) as reply:
                        statuses.append(reply.status_code)
                        next(reply.iter_lines(), None)
                    continue
                reply = http.request(method, path, json=body)
                statuses.append(reply.status_code)
                if reply.status_code >= 500:
                    failures.append(f"{method} {path} {body}: {reply.status_code} {reply.text[:300]}")
            except httpx.HTTPError as exc:
                failures.append(f"{method} {path}: {type(exc).__name__} {exc}")


def test_three_models_under_a_budget_of_two_soak_without_a_5xx(tiny_gguf_dir, tmp_path, capfd):
    pytest.importorskip("llama_cpp")
    from draftwise.loading import LoadOptions, load_engine
    from draftwise.server import catalog

    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("target.gguf", "draft.gguf", "twin.gguf"):
        shutil.copy(tiny_gguf_dir / name, folder / name)
    options = LoadOptions(n_ctx=256, threads=1, slots=1)
    speculation = SpeculationConfig(policy="fixed", max_draft_tokens=3)
    served = catalog.chosen(str(folder), str(folder / "target.gguf"))
    sources = catalog.sources(
        served,
        lambda spec: load_engine(spec, "ngram", options=options, speculation=speculation),
        n_ctx=256,
        num_slots=1,
    )
    sizes = sorted(s.memory_bytes for s in sources)
    assert len(sources) == 3 and sizes[0] > 0
    budget = sizes[-1] + sizes[-2]  # any two, never three
    app = create_pool_app(sources, budget_bytes=budget, keep_alive_s=2.0)
    names = ["target.gguf", "draft", "twin:latest", "target.gguf:latest", "draft.gguf"]
    statuses: list[int] = []
    failures: list[str] = []
    started = time.monotonic()
    with LiveServer(None, app=app) as live:
        pool = app.state.pool
        deadline = started + SOAK_S
        threads = [
            threading.Thread(target=client, args=(live.url, names, seed, deadline, statuses, failures))
            for seed in range(NUM_CLIENTS)
        ]
        for thread in threads:
            thread.start()
        held = []
        while any(t.is_alive() for t in threads):
            held.append(sum(m.memory_bytes for m in pool.loaded()))
            time.sleep(0.05)
        for thread in threads:
            thread.join(60)
        ps = httpx.get(f"{live.url}/api/ps", timeout=30)
        assert ps.status_code == 200 and len(ps.json()["models"]) <= 2
        unload = httpx.post(
            f"{live.url}/api/generate", json={"model": "draft", "prompt": "", "keep_alive": 0}, timeout=30
        )
        assert unload.status_code == 200
    elapsed = time.monotonic() - started
    assert failures == []
    assert len(statuses) > 50 and max(statuses) < 500
    assert {200, 404}.issubset(statuses)
    assert max(held) <= budget
    assert elapsed < 60
    # the log still reaches descriptors 1 and 2 after every load and unload
    os.write(1, b"soak: stdout after the soak\n")
    os.write(2, b"soak: stderr after the soak\n")
    out, err = capfd.readouterr()
    assert "soak: stdout after the soak" in out and "soak: stderr after the soak" in err
