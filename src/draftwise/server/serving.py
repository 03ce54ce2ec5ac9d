"""Requests <-> engine: one worker thread feeds the engine from a bounded FIFO queue.

The worker runs a Batcher over the engine's slots (one slot: one request at a time; with
`serve --parallel N`, up to N decode together, one target forward per step); queued
requests join as slots free up, in arrival order. Beyond the queue's bound (requests
waiting for a slot, not those a free slot is about to take) a request is refused at once
(503, Retry-After) rather than left to wait without end. A job's text pieces travel back
to the event loop through an asyncio queue; its cancel flag reaches the engine through
the `cancelled` callback, checked before every step.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from draftwise.batching import PREFILL_CHUNK, SOLO_PREFILL_CHUNK, Batcher, Done, Emitted, Failed
from draftwise.engine import Engine, Generation, Result
from draftwise.server.metrics import ServerMetrics
from draftwise.types import SamplingParams, SpeculationConfig

logger = logging.getLogger("draftwise.server")


@dataclass(frozen=True)
class Piece:
    """A job's next text."""

    text: str
    logprobs: tuple = ()  # the TokenLogprobs of the tokens this text completes (when asked)
    prompt_logprobs: tuple | None = None  # the prompt's, with a request's first piece (when asked)
    spans: tuple = ()  # the TokenSpans of this text (when the request asks for token sources)


@dataclass(frozen=True)
class Finished:
    """A job's last event when the engine gave it a result (whatever its finish_reason)."""

    result: Result
    # Whether the request may be told how much of its prompt was cached: not when the cache
    # came from another tenant's (API key's) request.
    cache_visible: bool = True
    predicted: bool = False  # the request carried a prediction (usage reports what became of it)


@dataclass(frozen=True)
class JobFailed:
    """A job's last event when it ends without a result: its step failed (the Batcher's Failed),
    it could not start, or it was cancelled before the engine took it (error: JobCancelled)."""

    error: BaseException


Event = Piece | Finished | JobFailed


class Job:
    """The server's record of one engine request: the engine's Generation (set by Serving.submit)
    with the server's bookkeeping around it (who sent it to which endpoint, its cancel flag, when
    it was queued, started and first answered, and the channel its events take back to the event
    loop). Its life: queued -> running -> Finished or JobFailed."""

    def __init__(
        self, job_id: str, endpoint: str, prompt_ids: list[int], tenant: int | None = None, predicted: bool = False
    ) -> None:
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


class ServerBusy(RuntimeError):
    """The queue is full: the request is refused, nothing was queued."""


# Requests that may wait for a slot; beyond it the server answers 503 at once.
MAX_QUEUE = 64
# The worker thread ends after this long with nothing to do, and its llama.cpp OpenMP team with
# it: a server of several models holds a team only for the models decoding now
# (compute_thread.py: more OpenMP threads than CPUs make every barrier sleep in the kernel).
WORKER_IDLE_S = 2.0


class Serving:
    """Owns the engine for the server: a FIFO of jobs and the one thread that runs them."""

    def __init__(
        self,
        engine: Engine,
        metrics: ServerMetrics | None = None,
        *,
        max_queue: int = MAX_QUEUE,
        prefill_chunk: int = PREFILL_CHUNK,
    ) -> None:
        self.engine = engine
        self.metrics = metrics or ServerMetrics()
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._submit_lock = threading.Lock()
        self._seq = itertools.count(1)
        self._closed = False
        self.running: dict[int, Job] = {}  # by slot
        # Whose request last filled each slot's cache (a tenant never learns of another's prefix).
        self._cache_tenant: dict[int, int | None] = {}
        self.metrics.track_queue(lambda: self._queue.qsize(), lambda: len(self.running))
        self.metrics.slots_total.set(engine.num_slots)
        self.metrics.track_memory(engine)

    @property
    def queue_length(self) -> int:
        return self._queue.qsize()

    @property
    def num_free_slots(self) -> int:
        return self.engine.num_slots - len(self.running)

    # ------------------------------------------------------------ event-loop side
    def encode(
        self, prompt: str | None = None, messages: Sequence[dict] | None = None, tools: Sequence[dict] | None = None
    ) -> list[int]:
        """Tokenise (chat template for messages, with tools if any). Thread-safe: it reads the
        vocabulary only."""
        return self.engine.encode_prompt(prompt, messages, tools)

    def submit(
        self,
        job: Job,
        sampling: SamplingParams,
        speculation: SpeculationConfig | None,
        drafters: Sequence[str] | None,
        prediction: str | None = None,
        token_sources: bool = False,
    ) -> Job:
        """Queue a job. Raises ConfigError/PromptTooLongError now, before anything is queued."""
        if self._closed:
            raise RuntimeError("the server is shutting down")
        # NOTE: Engine.stream validates eagerly and takes the engine lock only when iterated,
        # so calling it here checks the request without waiting for the engine.
        job.generation = self.engine.stream(
            prompt_ids=job.prompt_ids,
            sampling=sampling,
            speculation=speculation,
            cancelled=job.is_cancelled,
            drafters=drafters,
            prediction=prediction,
            token_sources=token_sources,
        )
        with self._submit_lock:  # submits run in worker threads: one bound check and put at a time
            waiting = self._queue.qsize() - self.num_free_slots  # a free slot takes a queued job next
            if waiting >= self.max_queue:
                raise ServerBusy(
                    f"the server is busy: {waiting} requests are waiting for "
                    f"{self.engine.num_slots} slot(s); retry shortly"
                )
            job.seq = next(self._seq)
            self._queue.put(job)
            self._ensure_worker()  # after the put: a worker ending now sees the job or is replaced
        return job

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what is queued or running and stop the worker."""
        self._closed = True
        for running in list(self.running.values()):
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

    def _idle_end(self) -> bool:
        """Whether the idle worker ends now: nothing queued (checked under the start lock, so a
        job put after it finds no worker and starts one)."""
        with self._start_lock:
            if not self._queue.empty():
                return False
            self._thread = None
            return True

    def _cancelled_in_queue(self, job: Job) -> bool:
        """Answer a job cancelled while it waited (it never reaches the engine)."""
        if not job.is_cancelled():
            return False
        logger.info("%s: cancelled while queued (%s)", job.id, job.cancel_reason)
        self.metrics.requests.labels(job.endpoint, "cancelled").inc()
        job.push(JobFailed(JobCancelled(job.cancel_reason)))
        return True

    def _same_tenant(self, tenant: int | None, slot: int) -> bool:
        """Whether slot's cache was last filled by tenant's requests (or by none)."""
        return self._cache_tenant.get(slot, tenant) == tenant

    def _claim(self, slot: int, job: Job) -> bool:
        """Whether job may see how much of its prompt the slot had cached (same tenant)."""
        visible = self._same_tenant(job.tenant, slot)
        self._cache_tenant[slot] = job.tenant
        return visible

    def _finished(self, job: Job, result: Result, cache_visible: bool) -> None:
        stats = result.stats
        if stats.finish_reason == "cancelled":
            logger.info(
                "%s: cancelled after %d generated tokens (%s); the caches stay consistent for the next request",
                job.id,
                stats.num_generated,
                job.cancel_reason or "cancelled",
            )
        now = time.monotonic()
        self.metrics.observe_request(
            job.endpoint,
            stats,
            queue_s=job.started_at - job.enqueued_at,
            total_s=now - job.enqueued_at,
            first_token_s=None if job.first_piece_at is None else job.first_piece_at - job.enqueued_at,
        )
        job.push(Finished(result, cache_visible, job.predicted))

    def _route(self, events: list[Emitted | Done | Failed], jobs: dict[int, tuple[Job, bool]]) -> None:
        """Hand the Batcher's events to their jobs: Emitted text, a Done result, a Failed step.
        Any other event is a bug in this module or the Batcher, so it raises."""
        for event in events:
            match event:
                case Emitted():
                    job, _ = jobs[id(event.generation)]
                    if job.first_piece_at is None:
                        job.first_piece_at = time.monotonic()
                    job.push(Piece(event.text, event.logprobs, event.prompt_logprobs, event.spans))
                case Done():
                    job, cache_visible = self._release(event.generation, jobs)
                    self._finished(job, event.result, cache_visible)
                case Failed():
                    job, _ = self._release(event.generation, jobs)
                    logger.error("%s: generation failed: %s", job.id, type(event.error).__name__)
                    self.metrics.requests.labels(job.endpoint, "error").inc()
                    job.push(JobFailed(event.error))
                case _:
                    raise TypeError(f"the Batcher sent an event of unknown type {type(event).__name__}")

    def _release(self, generation: Generation, jobs: dict[int, tuple[Job, bool]]) -> tuple[Job, bool]:
        """The ended generation's (job, cache visible); the job leaves the running ones."""
        job, cache_visible = jobs.pop(id(generation))
        self.running = {s: j for s, j in self.running.items() if j is not job}
        return job, cache_visible

    def _work(self) -> None:
        """Continuous batching: admit queued jobs into free slots between steps, step, route events.
        With one slot nothing else can be decoding: a prompt is read in SOLO_PREFILL_CHUNK-row chunks."""
        chunk = self.prefill_chunk if self.engine.num_slots > 1 else SOLO_PREFILL_CHUNK
        batcher = Batcher(self.engine, prefill_chunk=chunk)
        jobs: dict[int, tuple[Job, bool]] = {}  # id(generation) -> (job, cache visible)
        stopping = False
        while not (stopping and not batcher.active):
            # Cancelled requests (a client gone, an editor's request superseded) leave before new
            # ones are admitted: the newcomer can take the slot that holds its cache.
            self._route(batcher.reap(), jobs)
            while batcher.num_free and not stopping:
                try:  # wait for work only when there is nothing to step
                    job = self._queue.get(block=not batcher.active, timeout=None if batcher.active else WORKER_IDLE_S)
                except queue.Empty:
                    if not batcher.active and not jobs and self._idle_end():
                        return
                    break
                if job is None:
                    stopping = True
                    for running, _ in jobs.values():
                        running.cancel("server shutting down")
                    break
                if self._closed:
                    job.cancel("server shutting down")
                if self._cancelled_in_queue(job):
                    continue
                job.started_at = time.monotonic()
                try:
                    # a prompt prefix another slot holds is shared only within a tenant
                    slot = batcher.add(job.generation, share_from=partial(self._same_tenant, job.tenant))
                except Exception as exc:  # e.g. a drafter that cannot serve this slot
                    logger.exception("%s: could not start", job.id)
                    self.metrics.requests.labels(job.endpoint, "error").inc()
                    job.push(JobFailed(exc))
                    continue
                self.running[slot] = job
                jobs[id(job.generation)] = (job, self._claim(slot, job))
            if not batcher.active:
                continue
            try:
                events = batcher.step()
            except BaseException:  # never let one step kill the worker: the queue would hang
                logger.exception("unexpected failure in a batched step")
                events = batcher.fail(None, RuntimeError("internal error"))
            self.metrics.observe_batch(batcher.last_rows)
            self._route(events, jobs)
        while not self._queue.empty():  # answer whatever arrived during shutdown
            job = self._queue.get_nowait()
            if job is not None:
                job.push(JobFailed(JobCancelled("the server is shutting down")))
