"""Requests <-> engine: one worker thread feeds the engine from a FIFO queue.

The engine serves one request at a time, so requests wait in arrival order (fair, and
every one is answered). A job's text pieces travel back to the event loop through an
asyncio queue; its cancel flag reaches the engine through the `cancelled` callback,
which the engine checks before every step.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from draftwise.engine import Engine, Generation, Result
from draftwise.server.metrics import ServerMetrics
from draftwise.types import SamplingParams, SpeculationConfig

logger = logging.getLogger("draftwise.server")


@dataclass(frozen=True)
class Piece:
    text: str


@dataclass(frozen=True)
class Finished:
    result: Result
    # Whether the request may be told how much of its prompt was cached: not when the cache
    # came from another tenant's (API key's) request.
    cache_visible: bool = True
    predicted: bool = False  # the request carried a prediction (usage reports what became of it)


@dataclass(frozen=True)
class Failed:
    error: BaseException


Event = Piece | Finished | Failed


class Job:
    """One request's life: queued -> running -> finished; events flow worker -> event loop."""

    def __init__(self, job_id: str, endpoint: str, prompt_ids: list[int], tenant: int | None = None,
                 predicted: bool = False) -> None:
        self.id = job_id
        self.predicted = predicted
        self.tenant = tenant  # which API key sent it (None: the server has none)
        self.endpoint = endpoint
        self.prompt_ids = prompt_ids
        self.generation: Generation | None = None
        self.cancel_reason = ""
        self.enqueued_at = time.monotonic()
        self.started_at: float | None = None
        self.first_piece_at: float | None = None
        self.seq = 0  # arrival order, set by Serving.submit
        self._cancel = threading.Event()
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[Event] = asyncio.Queue()

    def cancel(self, reason: str) -> None:
        if not self._cancel.is_set():
            self.cancel_reason = reason
            self._cancel.set()

    def is_cancelled(self) -> bool:
        return self._cancel.is_set()

    async def next_event(self) -> Event:
        return await self._events.get()

    def push(self, event: Event) -> None:
        """Called from the worker thread."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
            self.cancel("server shutting down")


class JobCancelled(Exception):
    """The job was cancelled before the engine started it."""


class Serving:
    """Owns the engine for the server: a FIFO of jobs and the one thread that runs them."""

    def __init__(self, engine: Engine, metrics: ServerMetrics | None = None) -> None:
        self.engine = engine
        self.metrics = metrics or ServerMetrics()
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._seq = itertools.count(1)
        self._closed = False
        self.running: Job | None = None
        self._cache_tenant: int | None = None  # whose request last filled the caches
        self.metrics.track_queue(lambda: self._queue.qsize(), lambda: int(self.running is not None))

    @property
    def queue_length(self) -> int:
        return self._queue.qsize()

    # ------------------------------------------------------------ event-loop side
    def encode(self, prompt: str | None = None, messages: Sequence[dict] | None = None) -> list[int]:
        """Tokenise (chat template for messages). Thread-safe: it reads the vocabulary only."""
        return self.engine.encode_prompt(prompt, messages)

    def submit(self, job: Job, sampling: SamplingParams, speculation: SpeculationConfig | None,
               drafters: Sequence[str] | None, prediction: str | None = None) -> Job:
        """Queue a job. Raises ConfigError/PromptTooLongError now, before anything is queued."""
        if self._closed:
            raise RuntimeError("the server is shutting down")
        # NOTE: Engine.stream validates eagerly and takes the engine lock only when iterated,
        # so calling it here checks the request without waiting for the engine.
        job.generation = self.engine.stream(prompt_ids=job.prompt_ids, sampling=sampling, speculation=speculation,
                                            cancelled=job.is_cancelled, drafters=drafters, prediction=prediction)
        job.seq = next(self._seq)
        self._ensure_worker()
        self._queue.put(job)
        return job

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what is queued or running and stop the worker."""
        self._closed = True
        running = self.running
        if running is not None:
            running.cancel("server shutting down")
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------ worker side
    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="draftwise-engine", daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                break
            if self._closed:
                job.cancel("server shutting down")
            try:
                self._run(job)
            except BaseException:  # never let one job kill the worker: the queue would hang
                logger.exception("%s: unexpected failure in the worker", job.id)
                job.push(Failed(RuntimeError("internal error")))
        while not self._queue.empty():  # answer whatever arrived during shutdown
            job = self._queue.get_nowait()
            if job is not None:
                job.push(Failed(JobCancelled("the server is shutting down")))

    def _run(self, job: Job) -> None:
        if job.is_cancelled():
            logger.info("%s: cancelled while queued (%s)", job.id, job.cancel_reason)
            self.metrics.requests.labels(job.endpoint, "cancelled").inc()
            job.push(Failed(JobCancelled(job.cancel_reason)))
            return
        job.started_at = time.monotonic()
        self.running = job
        cache_visible, self._cache_tenant = self._cache_tenant == job.tenant, job.tenant
        gen = job.generation
        assert gen is not None
        try:
            for piece in gen:
                if job.first_piece_at is None:
                    job.first_piece_at = time.monotonic()
                job.push(Piece(piece))
        except Exception as exc:  # the engine reset its caches; report and serve the next job
            logger.exception("%s: generation failed", job.id)
            self.metrics.requests.labels(job.endpoint, "error").inc()
            job.push(Failed(exc))
            return
        finally:
            self.running = None
        result = gen.result
        assert result is not None
        stats = result.stats
        if stats.finish_reason == "cancelled":
            logger.info("%s: cancelled after %d generated tokens (%s); the caches stay consistent for the next request",
                        job.id, stats.num_generated, job.cancel_reason or "cancelled")
        now = time.monotonic()
        self.metrics.observe_request(
            job.endpoint, stats, queue_s=job.started_at - job.enqueued_at,
            total_s=now - job.enqueued_at,
            first_token_s=None if job.first_piece_at is None else job.first_piece_at - job.enqueued_at)
        job.push(Finished(result, cache_visible, job.predicted))
