"""`draftwise.server.ray_serve` on a local Ray cluster the module starts: two replicas of the
llama.cpp engine on the tiny GGUF models, queried through Ray's HTTP proxy with the openai client
and compared with the single server (create_app under uvicorn) on the same models."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from click.testing import CliRunner

from draftwise.cli import main
from draftwise.loading import LoadOptions, load_engine
from draftwise.server import create_app
from draftwise.server.ray_serve import APP_NAME, REPLICA_HEADER, ReplicaConfig, Scaling, deployment_options, ray_app
from draftwise.types import SpeculationConfig
from tests.server.conftest import LiveServer

MODEL = "tiny"
API_KEY = "sk-ray-test"
N_CTX = 2048
PROMPTS = ["def add(a, b):", "a story about caches", "list three colours", "count: 1 2 3 4"]
# slow: the tests through the cluster share one local Ray cluster with two replicas (about 6 s to
# start and 4 s to stop on 2 cores)
through_ray = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def replica_config(tiny_gguf_dir) -> ReplicaConfig:
    return ReplicaConfig(
        target=str(tiny_gguf_dir / "target.gguf"),
        draft=str(tiny_gguf_dir / "twin.gguf"),
        options=LoadOptions(n_ctx=N_CTX, threads=1, slots=2),
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=3),
        model_name=MODEL,
        api_keys=(API_KEY,),
    )


@pytest.fixture(scope="module")
def ray_url(replica_config):
    """Two replicas (half a CPU each) behind Ray's proxy on a free port; torn down with the module."""
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    pytest.importorskip("gguf")
    pytest.importorskip("llama_cpp")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(ray_app(replica_config, Scaling(replicas=2, num_cpus=0.5)), name=APP_NAME, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def single_url(replica_config):
    """The same engine settings served by the single server, as `draftwise serve` runs it."""
    c = replica_config
    engine = load_engine(c.target, c.draft, options=c.options, speculation=c.speculation)
    with LiveServer(engine, app=create_app(engine, MODEL, api_keys=c.api_keys)) as live:
        yield live.url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def stream_chat(url: str, prompt: str, max_tokens: int = 48) -> tuple[str, str | None, str, dict]:
    """(text, finish_reason, replica id or '', usage.speculative) of one streamed greedy chat."""
    raw = client(url).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, speculative = "", None, {}
    for chunk in raw.parse():
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            speculative = chunk.usage.model_extra["speculative"]
    return text, finish, raw.headers.get(REPLICA_HEADER, ""), speculative


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


# ---------------------------------------------------------------------- without a cluster (no Ray needed)
def test_without_ray_the_flag_names_the_extra(tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None; from draftwise.cli import main; "
        f"main(['serve', '--ray', '--target', {str(tmp_path / 'absent.gguf')!r}])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and 'pip install "draftwise[ray]"' in done.stderr, done.stderr


def test_nothing_else_imports_ray():
    src = Path(__file__).parents[2] / "src" / "draftwise"
    importers = [
        p.relative_to(src).as_posix()
        for p in src.rglob("*.py")
        if re.search(r"^\s*(import ray|from ray)\b", p.read_text(), re.MULTILINE)
    ]
    assert importers == ["server/ray_serve.py"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--replicas", "2"], "need --ray"),
        (["--ray", "--replicas", "2", "--autoscale", "1:2"], "not both"),
        (["--ray", "--autoscale", "4"], "MIN:MAX"),
        (["--ray", "--autoscale", "3:1"], "0 <= MIN <= MAX"),
        (["--ray", "--max-queue", "0"], "--max-queue"),
    ],
)
def test_bad_ray_options_are_refused_before_any_cluster_starts(args, message):
    result = CliRunner().invoke(main, ["serve", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_deployment_follows_the_engines_slots(tmp_path):
    two_slots = ReplicaConfig(target="any.gguf", options=LoadOptions(threads=1, slots=2))
    options = deployment_options(two_slots, Scaling(replicas=2, num_cpus=0.5))
    assert options["max_ongoing_requests"] == 2 == two_slots.num_slots and options["num_replicas"] == 2
    assert options["ray_actor_options"] == {"num_cpus": 0.5, "num_gpus": 0}
    auto = deployment_options(ReplicaConfig(options=LoadOptions(slots=0)), Scaling(autoscale=(1, 4)))
    assert auto["max_ongoing_requests"] == 4 and "num_replicas" not in auto
    assert auto["autoscaling_config"]["target_ongoing_requests"] == 4
    transformers_dir = ReplicaConfig(target=str(tmp_path), options=LoadOptions(slots=0))  # one request at a time
    assert deployment_options(transformers_dir, Scaling())["max_ongoing_requests"] == 1


# ---------------------------------------------------------------------- through the cluster
@through_ray
def test_two_replicas_serve_concurrent_streams_equal_to_the_single_server(ray_url, single_url):
    prompts = PROMPTS * 2  # 8 concurrent streams over 2 replicas x 2 slots: Ray must queue and spread them
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: stream_chat(ray_url, p), prompts))
    expected = {p: stream_chat(single_url, p)[:2] for p in PROMPTS}
    assert [(text, finish) for text, finish, _, _ in answers] == [expected[p] for p in prompts]
    assert all(finish in ("stop", "length") for _, finish, _, _ in answers)
    assert all(spec["num_drafted"] > 0 for _, _, _, spec in answers)  # usage.speculative passes through
    per_replica: dict[str, int] = {}
    for _, _, replica, _ in answers:
        per_replica[replica] = per_replica.get(replica, 0) + 1
    assert len(per_replica) == 2 and "" not in per_replica, per_replica


BAD_REQUESTS = [
    ("malformed JSON", "/v1/chat/completions", b'{"model": "tiny", "messages": ['),
    ("missing messages", "/v1/chat/completions", {"model": MODEL}),
    ("string number", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": "5"}),
    ("n = 0", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}),
    ("unknown model", "/v1/chat/completions", {"model": "gpt-5", "messages": [{"role": "user", "content": "x"}]}),
    ("too long", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": N_CTX}),
    ("no route", "/v1/nowhere", {}),
]


@through_ray
@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_input_gets_the_same_error_json_as_the_single_server(ray_url, single_url, case):
    _, path, body = case
    kwargs = (
        {"content": body, "headers": {"content-type": "application/json"}}
        if isinstance(body, bytes)
        else {"json": body}
    )
    auth = {"authorization": f"Bearer {API_KEY}"}
    answers = []
    for url in (ray_url, single_url):
        r = httpx.post(f"{url}{path}", timeout=30, **{**kwargs, "headers": {**kwargs.get("headers", {}), **auth}})
        answers.append((r.status_code, r.json()))
    assert answers[0] == answers[1] and 400 <= answers[0][0] < 500, answers


@through_ray
def test_api_key_is_enforced_through_ray(ray_url, single_url):
    for url in (ray_url, single_url):
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(f"{ray_url}/v1/models").json() == httpx.get(f"{single_url}/v1/models").json()
    # /health answers without a key, as on the single server, and tells the slots to the key's holder only
    assert httpx.get(f"{ray_url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{ray_url}/health", headers={"Authorization": f"Bearer {API_KEY}"}).json()["slots"] == 2
    # the Host and Origin checks hold through Ray's proxy too
    assert httpx.get(f"{ray_url}/health", headers={"Host": "evil.example"}).status_code == 403


def _long_stream(url: str):
    """(replica id, chunk stream) of a completion that would fill the context window."""
    raw = client(url).completions.with_raw_response.create(
        model=MODEL,
        prompt="a long story",
        max_tokens=N_CTX - 64,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    return raw.headers[REPLICA_HEADER], raw.parse()


@through_ray
def test_client_disconnect_cancels_the_generation_on_its_replica(ray_url):
    replica, stream = _long_stream(ray_url)
    for _, _chunk in zip(range(3), stream):
        pass
    stream.close()
    deadline = time.monotonic() + 30
    cancelled = 'draftwise_requests_total{endpoint="completions",finish_reason="cancelled"}'
    while True:  # /metrics is one replica's: ask until the one that served the stream answers
        r = httpx.get(f"{ray_url}/metrics", headers={"authorization": f"Bearer {API_KEY}"}, timeout=30)
        if r.headers[REPLICA_HEADER] == replica and metric(r.text, cancelled) >= 1:
            break
        assert time.monotonic() < deadline, "the generation was not cancelled"
        time.sleep(0.1)
    assert metric(r.text, "draftwise_generated_tokens_total") < N_CTX - 64


@through_ray
def test_killed_replica_fails_its_stream_loudly_and_later_requests_succeed(ray_url):
    """Runs last in the module: it kills one of the two replicas."""
    replica, stream = _long_stream(ray_url)
    finish, error, num_chunks = None, None, 0
    try:
        for chunk in stream:
            num_chunks += 1
            if num_chunks == 3:
                _kill_replica(replica)
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
    except (openai.APIError, httpx.HTTPError) as exc:
        error = exc
    # Never a stream that just stops: either the client sees an error, or the stream says how it ended.
    assert error is not None or finish is not None
    assert finish is None, f"the stream completed ({num_chunks} chunks) before the replica was killed"

    answers = [stream_chat(ray_url, p, max_tokens=8) for p in PROMPTS]
    assert all(finish in ("stop", "length") for _, finish, _, _ in answers)
    assert replica not in {r for _, _, r, _ in answers}
    deadline = time.monotonic() + 120
    while _running_replicas() < 2:  # Serve replaces the dead replica
        assert time.monotonic() < deadline, "the killed replica was not replaced"
        time.sleep(0.5)


def _kill_replica(unique_id: str) -> None:
    import ray

    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::") and a["name"].endswith(f"#{unique_id}")
    ]
    assert len(names) == 1, names
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)


def _running_replicas() -> int:
    from ray import serve

    deployment = next(iter(serve.status().applications[APP_NAME].deployments.values()))
    return deployment.replica_states.get("RUNNING", 0)
