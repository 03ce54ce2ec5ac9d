"""Fixtures: a toy engine and a real uvicorn server on a free loopback port, in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import uvicorn

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.engine import Engine
from draftwise.server import create_app
from draftwise.server.errors import uvicorn_options
from draftwise.types import SpeculationConfig

MODEL = "toy-40"
API_KEY = "sk-test-key"


def make_engine(*, n_ctx: int = 4096, step_delay_s: float = 0.0, draft_model: bool = True, slots: int = 1) -> Engine:
    """Target: ToyModel(vocab 40, sharpness 3). Draft: same table, flatter (same argmax, other probabilities).
    slots > 1: the server batches that many requests."""
    target_model = ToyModel(vocab_size=40, sharpness=3)
    if step_delay_s:

        def slow_logits(context, _model=target_model):
            time.sleep(step_delay_s)
            return _model.logits(context)

        target = ToyBackend(logits_fn=slow_logits, vocab_size=40, n_ctx=n_ctx, name="slow-toy", slots=slots)
    else:
        target = ToyBackend(target_model, n_ctx=n_ctx, name="toy", slots=slots)
    drafters = [NgramDrafter(2, 4)]
    if draft_model:
        draft = ToyBackend(ToyModel(vocab_size=40, sharpness=2.5), n_ctx=n_ctx, name="toy-draft", slots=slots)
        drafters.insert(0, ModelDrafter(draft, name="draft"))
    # NOTE: the fixed policy drafts the same k every step, so seeded sampling is reproducible
    # across requests (a learning policy would change k, and with it the random stream).
    return Engine(target, drafters, speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4))


class LiveServer:
    """uvicorn serving create_app(engine) from a daemon thread, as `draftwise serve` runs it
    (uvicorn_options); `url` is its base URL."""

    def __init__(self, engine: Engine, api_key: str | None = None, app=None, **options) -> None:
        self.engine = engine
        self.app = app or create_app(engine, MODEL, api_key=api_key)
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=0,
            log_config=None,
            log_level="warning",
            lifespan="on",
            **uvicorn_options(**options),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def server():
    with LiveServer(make_engine()) as live:
        yield live


@pytest.fixture
def start_server() -> Callable[..., LiveServer]:
    """Factory for servers a test needs to itself (fresh state, API key, slow engine)."""
    started: list[LiveServer] = []

    def start(engine: Engine | None = None, api_key: str | None = None) -> LiveServer:
        live = LiveServer(engine or make_engine(), api_key=api_key).__enter__()
        started.append(live)
        return live

    yield start
    for live in started:
        live.__exit__(None, None, None)


def wait_idle(serving, timeout_s: float = 5.0) -> bool:
    """True once nothing runs or waits on the server's engine (polled every 20 ms)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not serving.running and serving.queue_length == 0:
            return True
        time.sleep(0.02)
    return False
