"""`serve --models` on Ray Serve: every replica serves every model of the folder, each loaded
there when a request first names it (ray_serve.PoolConfig), answering as the single server does."""

from __future__ import annotations

import socket

import httpx
import openai
import pytest

from draftwise.loading import LoadOptions
from draftwise.server.ray_serve import APP_NAME, REPLICA_HEADER, PoolConfig, ReplicaConfig, Scaling, ray_app
from draftwise.types import SpeculationConfig

pytestmark = pytest.mark.slow  # starts a local Ray cluster (about 10 s on 2 cores)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_replica_serves_every_model_of_the_folder(tiny_gguf_dir):
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    pytest.importorskip("llama_cpp")
    config = ReplicaConfig(
        target=str(tiny_gguf_dir / "target.gguf"),
        draft="ngram",
        options=LoadOptions(n_ctx=256, threads=1, slots=1),
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=3),
        pool=PoolConfig(str(tiny_gguf_dir), keep_alive_s=-1),
    )
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(ray_app(config, Scaling(replicas=1, num_cpus=0.5)), name=APP_NAME, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
        names = [m.id for m in c.models.list()]
        assert names[0] == "target.gguf" and "draft.gguf" in names
        texts = {}
        for name in ("target.gguf", "draft.gguf"):
            raw = c.completions.with_raw_response.create(
                model=name, prompt="def add(a, b):", max_tokens=8, temperature=0
            )
            assert raw.headers.get(REPLICA_HEADER)
            texts[name] = raw.parse().choices[0].text
        assert texts["target.gguf"] != texts["draft.gguf"]
        loaded = {m["name"] for m in httpx.get(f"{url}/api/ps").json()["models"]}
        assert loaded == {"target.gguf:latest", "draft.gguf:latest"}
    finally:
        serve.shutdown()
        ray.shutdown()
