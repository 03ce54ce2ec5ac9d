"""Continuous batching: several requests decode together, one target forward per step.

A Batcher is the one loop every request runs in (Engine.generate/stream run a batch of
one in slot 0). Each step (step.py) builds one target forward holding each decoding
request's [uncached tail + draft] rows and a chunk of a joining request's prompt, then
verifies and commits per request. Requests join and leave between steps; each keeps its
slot's cache when it leaves, so a follow-up request with the same prefix reuses it. A
request whose step fails ends alone: its slot is reset, the others go on.

A Batcher works on a slot pool (slots.py): the slots, their lock, start() and finish(); it is
given the pool or what holds one (an Engine).

Example:
    batcher = Batcher(engine)   # engine loaded with slots, e.g. load_engine(..., options=LoadOptions(slots=4))
    results = batcher.run([engine.stream(p, sampling=s) for p in prompts])
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass

from draftwise.backends.base import ForwardInterrupted, common_prefix_length, interruptible
from draftwise.request import Generation, Result, RunningRequest, Slot
from draftwise.slots import HasSlotPool, SlotPool
from draftwise.step import step

# Prompt rows a step's forward carries at most: a joining request's prefill is cut into
# chunks so running streams are not stalled for a whole prompt (llama.cpp's n_batch role).
# From 128 rows on, the default target's forward costs the same per row, so prompts fill as
# fast as in larger chunks while a running stream waits for the shortest such forward at most.
PREFILL_CHUNK = 128
# A request alone (a Batcher of one slot: nothing else can be decoding) reads its prompt in
# larger chunks, so a cancellation is seen within one of them (a 28k-token prompt takes minutes
# on a 2-core CPU) at no cost: a multiple of llama.cpp's n_batch (512), the forwards it would
# split a whole read into anyway, so the cache holds the same values.
SOLO_PREFILL_CHUNK = 2048
_NO_STOP = nullcontext()
# A slot takes a prompt prefix from another slot only when that saves at least this many rows
# (below it, reading them again costs less than it is worth keeping the slot's own cache).
MIN_SHARED = 16


class BatchFull(RuntimeError):
    """Every slot is busy."""


@dataclass(frozen=True)
class Emitted:
    generation: Generation
    text: str
    logprobs: tuple = ()  # TokenLogprobs of the tokens this text completes (when the request asks)
    # The prompt's TokenLogprobs (tokens 2..), with a request's first text when it asks for them.
    prompt_logprobs: tuple | None = None
    spans: tuple = ()  # TokenSpans of this text (when the request asks for token sources)


@dataclass(frozen=True)
class Done:
    generation: Generation
    result: Result


@dataclass(frozen=True)
class Failed:
    generation: Generation
    error: BaseException


Event = Emitted | Done | Failed


class Batcher:
    """Up to pool.num_slots requests at once; `step()` advances all of them by one forward."""

    def __init__(
        self,
        pool: SlotPool | HasSlotPool,
        *,
        prefill_chunk: int | None = PREFILL_CHUNK,
        slots: Iterable[int] | None = None,
    ) -> None:
        """pool: the slot pool, or what holds one (an Engine); slots: those of its slots this
        Batcher may use (default: all not busy elsewhere); prefill_chunk: prompt rows per step
        (None: a whole prompt in one forward)."""
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.pool = pool if isinstance(pool, SlotPool) else pool.pool
        self.prefill_chunk = prefill_chunk
        self._free = self.pool.free_among(range(self.pool.num_slots) if slots is None else slots)
        self._last_used = [0.0] * self.pool.num_slots
        self.active: list[RunningRequest] = []  # in arrival order
        self.num_steps = 0
        self.num_interrupted = 0  # forwards stopped part-way: all their requests were cancelled
        self.last_rows = 0  # target rows in the last step's forward

    @property
    def num_slots(self) -> int:
        return self.pool.num_slots

    @property
    def num_free(self) -> int:
        return len(self._free)

    def add(self, generation: Generation, share_from: Callable[[int], bool] | None = None) -> int:
        """Start a validated request (from engine.stream) in a free slot; returns the slot.

        The slot is the free one whose cache shares the longest prefix with the prompt (ties:
        the least recently used), so conversations come back to their cached turns. When another
        slot, busy or not, holds a longer prefix of the prompt (the other choices of an `n` > 1
        request, an editor's completions of one prompt) and `share_from(its index)` allows it,
        the chosen slot takes that prefix from it (on llama.cpp a shared KV range, no copy) instead
        of reading it again."""
        spec = generation.request
        prompt = spec.prompt_ids
        pool = self.pool
        with pool.lock:
            free = pool.free_among(self._free)  # another Batcher may have claimed one since
            if not free:
                raise BatchFull(f"all {self.num_slots} slots are busy")
            shared = {i: common_prefix_length(pool.slot(i).target.cached_ids, prompt[:-1]) for i in free}
            index = max(free, key=lambda i: (shared[i], -self._last_used[i]))
            slot, keep = pool.slot(index), shared[index]
            if spec.sampling.prompt_logprobs is not None:
                keep = 0  # every prompt row is read again for its logits
            req = pool.start(generation, slot)
            slot.target.truncate(keep)
            if share_from is not None and spec.sampling.prompt_logprobs is None:
                keep = self._share(slot, prompt[:-1], keep, share_from)
            pool.claim(index)
        req.stats.num_reused_tokens = keep
        req.pending = list(prompt[keep:-1])
        self._free.discard(index)
        self.active.append(req)
        return index

    def _share(self, slot: Slot, prompt: list[int], keep: int, share_from: Callable[[int], bool]) -> int:
        """Give slot the longest prefix of prompt another allowed slot holds, if it is at least
        MIN_SHARED tokens longer than the keep tokens slot already has; returns what slot holds."""
        if not slot.target.capabilities.prefix_sharing:  # llama.cpp sequences can; others read again
            return keep
        best, length = None, keep + MIN_SHARED - 1
        for other in self.pool.open_slots():
            if other.index == slot.index or not share_from(other.index):
                continue
            shared = common_prefix_length(other.target.cached_ids, prompt)
            if shared > length:
                best, length = other, shared
        return length if best is not None and slot.target.share_prefix(best.target, length) else keep

    def reap(self) -> list[Event]:
        """End the cancelled requests now (their slots free, their caches kept): called before
        admitting new ones, a request that supersedes another takes the slot holding its cache."""
        events: list[Event] = []
        with self.pool.lock:
            for req in list(self.active):
                if req.cancelled is not None and req.cancelled():
                    req.stats.finish_reason = "cancelled"
                    self._finish(req, events)
        return events

    def step(self) -> list[Event]:
        """One forward for every active request: cancellations, prefill chunks, speculative
        steps; returns what happened (text, finished requests, failures). A request whose step
        fails ends alone; only a failed shared forward ends every request in it."""
        events: list[Event] = self.reap()
        with self.pool.lock:
            t_step = time.perf_counter()
            decoding = [req for req in self.active if not req.pending]
            prefills, budget = [], self.prefill_chunk
            for req in self.active:  # arrival order: the earliest prompt is filled first
                if req.pending and (budget is None or budget > 0):
                    chunk = req.pending if budget is None else req.pending[:budget]
                    if req.sampling.prompt_logprobs is not None:
                        chunk = chunk[:PREFILL_CHUNK]  # its rows' logits: [chunk, V] each step
                    prefills.append((req, chunk))
                    budget = None if budget is None else budget - len(chunk)
            if not decoding and not prefills:
                return events
            # A tree (several branches in one pass) is a one-request case, chosen here.
            trees = len(decoding) == 1 and not prefills and decoding[0].trees
            # A forward that reads the last chunks of prompts stops part-way once every request
            # in it is cancelled (an editor's request superseded mid-prompt): the newer one need
            # not wait for a part it does not share. Only last chunks (of a chunked read): what
            # changes between an editor's requests (the typed line, the suffix) is at a FIM
            # prompt's end, and the earlier chunks (extra context, the lines above) are what the
            # newer request reuses, so they are read to their end.
            watched = [req.cancelled for req, _ in prefills]
            stoppable = (
                not decoding
                and self.prefill_chunk is not None
                and all(c is not None for c in watched)
                and all(len(chunk) == len(req.pending) for req, chunk in prefills)
            )
            try:
                with interruptible(self.pool.target, lambda: all(c() for c in watched)) if stoppable else _NO_STOP:
                    result = step(
                        self.pool.target,
                        decoding,
                        [(req.slot.target, chunk, req) for req, chunk in prefills],
                        trees=trees,
                        target_time=self.pool.shared_target_time,
                    )
            except BaseException as exc:  # outside any one request's phases: ends every request
                events += self.fail(None, exc)
                if not isinstance(exc, Exception):
                    raise
                return events
            if isinstance(result.forward_error, ForwardInterrupted):
                self.num_interrupted += 1  # nothing was read: the cancelled requests end, caches kept
                return events + self.reap()
            self.num_steps += 1
            self.last_rows = result.rows
            if result.forward_error is not None:
                events += self.fail([req for req, _ in prefills], result.forward_error)
            for j, error in result.prefill_errors.items():
                events += self.fail([prefills[j][0]], error)
            for j, (req, chunk) in enumerate(prefills if result.forward_error is None else ()):
                if j in result.prefill_errors:
                    continue
                del req.pending[: len(chunk)]
                if not req.pending:
                    now = time.perf_counter()
                    req.stats.prefill_ms = 1000 * (now - req.admitted_at)
                    req.t_decode = now
            pushed = []  # (active, its text piece, its context when the step began)
            for req, outcome in zip(decoding, result.outcomes):
                context = len(req.context)
                try:
                    if isinstance(outcome, Exception):
                        raise outcome
                    pushed.append((req, req.push(outcome), context))
                except Exception as exc:
                    events += self.fail([req], exc)
            step_ms = 1000 * (time.perf_counter() - t_step)
            for req, piece, context in pushed:
                req.stats.record_time(result.phase_ms, step_ms, result.rows, context)
                if piece:
                    events.append(self._emitted(req, piece, tuple(req.take_logprobs()), req.take_spans(req.emitted)))
                if req.stats.finish_reason:
                    self._finish(req, events)
        return events

    def abandon(self) -> None:
        """Drop every active request between steps without an answer (the caller stopped
        listening); the caches stay consistent, so the next request reuses them."""
        with self.pool.lock:
            for req in list(self.active):
                self._release(req)

    def fail(self, active: list[RunningRequest] | None, error: BaseException) -> list[Event]:
        """End requests (None: every active one) with an error; their caches are forgotten."""
        events: list[Event] = []
        with self.pool.lock:
            for req in list(self.active if active is None else active):
                req.slot.target.reset()
                self._release(req)
                events.append(Failed(req.generation, error))
        return events

    def _finish(self, req: RunningRequest, events: list[Event]) -> None:
        piece, result = self.pool.finish(req)
        rest = tuple(req.take_logprobs(final=True))
        if piece or rest:
            events.append(self._emitted(req, piece, rest, req.take_spans(len(result.text))))
        req.generation.result = result
        self._release(req)
        events.append(Done(req.generation, result))

    def _emitted(self, req: RunningRequest, piece: str, logprobs: tuple, spans: tuple) -> Emitted:
        """An Emitted event; a request's first carries its prompt's logprobs if it asked for them."""
        prompt = None
        if req.sampling.prompt_logprobs is not None and not req.prompt_sent:
            prompt, req.prompt_sent = tuple(req.prompt_logprobs), True
        return Emitted(req.generation, piece, logprobs, prompt, spans)

    def _release(self, req: RunningRequest) -> None:
        self.active.remove(req)
        index = req.slot.index
        self._free.add(index)
        self.pool.release(index)  # under the pool's lock, which guards its busy set
        self._last_used[index] = time.perf_counter()

    def run(self, generations: Iterable[Generation]) -> list[Result]:
        """Run requests to the end, as many at once as there are slots (the rest wait in
        order); results in the order given. A failed request raises its error at the end."""
        waiting: deque[Generation] = deque(generations)
        order = list(waiting)
        errors: dict[int, BaseException] = {}
        while waiting or self.active:
            while waiting and self._free:
                self.add(waiting.popleft())
            for event in self.step():
                if isinstance(event, Failed):
                    errors[id(event.generation)] = event.error
        for g in order:
            if id(g) in errors:
                raise errors[id(g)]
        return [g.result for g in order]  # type: ignore[misc]
