"""Continuous batching: several requests decode together, one target forward per step.

A Batcher is the one loop every request runs in (Engine.generate/stream run a batch of
one in slot 0). Each step (step.py) builds one target forward holding each decoding
request's [uncached tail + draft] rows and a chunk of a joining request's prompt, then
verifies and commits per request. Requests join and leave between steps; each keeps its
slot's cache when it leaves, so a follow-up request with the same prefix reuses it. A
request whose step fails ends alone: its slot is reset, the others go on.

Example:
    batcher = Batcher(engine)   # engine loaded with slots, e.g. load_engine(..., options=LoadOptions(slots=4))
    results = batcher.run([engine.stream(p, sampling=s) for p in prompts])
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from draftwise.backends.base import ForwardInterrupted, common_prefix_length, interruptible
from draftwise.request import Generation, Request, Result
from draftwise.step import step

if TYPE_CHECKING:
    from draftwise.engine import Engine
    from draftwise.request import Slot

# Prompt rows a step's forward carries at most: a joining request's prefill is cut into
# chunks so running streams are not stalled for a whole prompt (llama.cpp's n_batch role);
# a Batcher of one slot (nothing else can be decoding) reads a prompt whole.
# Measured here on the default 1.5B target: 64, 128, 256, 512 rows take 0.59, 1.09, 2.18,
# 4.37 s, the same ~8.5 ms per row from 128 on, so 128 fills prompts as fast as larger
# chunks while a running stream waits ~1 s at most for its next step.
PREFILL_CHUNK = 128
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


@dataclass(frozen=True)
class Done:
    generation: Generation
    result: Result


@dataclass(frozen=True)
class Failed:
    generation: Generation
    error: BaseException


Event = Emitted | Done | Failed


@dataclass
class _Active:
    generation: Generation
    request: Request
    pending: list[int]  # prompt tokens not yet in the slot's cache (prefill still to run)
    admitted_at: float = field(default_factory=time.perf_counter)
    prompt_sent: bool = False  # its prompt logprobs went out (with its first text)


class Batcher:
    """Up to engine.num_slots requests at once; `step()` advances all of them by one forward."""

    def __init__(
        self, engine: Engine, *, prefill_chunk: int | None = PREFILL_CHUNK, slots: Iterable[int] | None = None
    ) -> None:
        """slots: the engine slots this Batcher may use (default: all not busy elsewhere);
        prefill_chunk: prompt rows per step (None: a whole prompt in one forward)."""
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.engine = engine
        self.prefill_chunk = prefill_chunk
        self._free = set(range(engine.num_slots) if slots is None else slots) - engine.busy_slots
        self._last_used = [0.0] * engine.num_slots
        self.active: list[_Active] = []
        self.num_steps = 0
        self.num_interrupted = 0  # forwards stopped part-way: all their requests were cancelled
        self.last_rows = 0  # target rows in the last step's forward

    @property
    def num_slots(self) -> int:
        return self.engine.num_slots

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
        if not self._free:
            raise BatchFull(f"all {self.num_slots} slots are busy")
        spec = generation.request
        assert spec is not None, "add() takes a Generation from engine.stream()"
        prompt = spec.prompt_ids
        with self.engine.lock:
            shared = {i: common_prefix_length(self.engine.slot(i).target.cached_ids, prompt[:-1]) for i in self._free}
            index = max(self._free, key=lambda i: (shared[i], -self._last_used[i]))
            slot, keep = self.engine.slot(index), shared[index]
            if spec.sampling.prompt_logprobs is not None:
                keep = 0  # every prompt row is read again for its logits
            req = self.engine.start(spec, slot)
            slot.target.truncate(keep)
            if share_from is not None and spec.sampling.prompt_logprobs is None:
                keep = self._share(slot, prompt[:-1], keep, share_from)
        req.stats.num_reused_tokens = keep
        self._free.discard(index)
        self.engine.busy_slots.add(index)
        self.active.append(_Active(generation, req, list(prompt[keep:-1])))
        return index

    def _share(self, slot: Slot, prompt: list[int], keep: int, share_from: Callable[[int], bool]) -> int:
        """Give slot the longest prefix of prompt another allowed slot holds, if it is at least
        MIN_SHARED tokens longer than the keep tokens slot already has; returns what slot holds."""
        if not slot.target.capabilities.prefix_sharing:  # llama.cpp sequences can; others read again
            return keep
        best, length = None, keep + MIN_SHARED - 1
        for other in self.engine.open_slots():
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
        with self.engine.lock:
            for a in list(self.active):
                if a.request.cancelled is not None and a.request.cancelled():
                    a.request.stats.finish_reason = "cancelled"
                    self._finish(a, events)
        return events

    def step(self) -> list[Event]:
        """One forward for every active request: cancellations, prefill chunks, speculative
        steps; returns what happened (text, finished requests, failures). A request whose step
        fails ends alone; only a failed shared forward ends every request in it."""
        events: list[Event] = self.reap()
        with self.engine.lock:
            t_step = time.perf_counter()
            decoding = [a for a in self.active if not a.pending]
            prefills, budget = [], self.prefill_chunk
            for a in self.active:  # arrival order: the earliest prompt is filled first
                if a.pending and (budget is None or budget > 0):
                    chunk = a.pending if budget is None else a.pending[:budget]
                    if a.request.sampling.prompt_logprobs is not None:
                        chunk = chunk[:PREFILL_CHUNK]  # its rows' logits: [chunk, V] each step
                    prefills.append((a, chunk))
                    budget = None if budget is None else budget - len(chunk)
            if not decoding and not prefills:
                return events
            # A tree (several branches in one pass) is a one-request case, chosen here.
            trees = len(decoding) == 1 and not prefills and decoding[0].request.trees
            # A forward that reads the last chunks of prompts stops part-way once every request
            # in it is cancelled (an editor's request superseded mid-prompt): the newer one need
            # not wait for a part it does not share. Only last chunks (of a chunked read): what
            # changes between an editor's requests (the typed line, the suffix) is at a FIM
            # prompt's end, and the earlier chunks (extra context, the lines above) are what the
            # newer request reuses, so they are read to their end.
            watched = [a.request.cancelled for a, _ in prefills]
            stoppable = (
                not decoding
                and self.prefill_chunk is not None
                and all(c is not None for c in watched)
                and all(len(chunk) == len(a.pending) for a, chunk in prefills)
            )
            try:
                with interruptible(self.engine.target, lambda: all(c() for c in watched)) if stoppable else _NO_STOP:
                    result = step(
                        self.engine.target,
                        [a.request for a in decoding],
                        [(a.request.slot.target, chunk, a.request) for a, chunk in prefills],
                        trees=trees,
                        target_time=self.engine.shared_target_time,
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
                events += self.fail([a for a, _ in prefills], result.forward_error)
            for j, error in result.prefill_errors.items():
                events += self.fail([prefills[j][0]], error)
            for j, (a, chunk) in enumerate(prefills if result.forward_error is None else ()):
                if j in result.prefill_errors:
                    continue
                del a.pending[: len(chunk)]
                if not a.pending:
                    now = time.perf_counter()
                    a.request.stats.prefill_ms = 1000 * (now - a.admitted_at)
                    a.request.t_decode = now
            pushed = []  # (active, its text piece, its context when the step began)
            for a, outcome in zip(decoding, result.outcomes):
                context = len(a.request.context)
                try:
                    if isinstance(outcome, Exception):
                        raise outcome
                    pushed.append((a, a.request.push(outcome), context))
                except Exception as exc:
                    events += self.fail([a], exc)
            step_ms = 1000 * (time.perf_counter() - t_step)
            for a, piece, context in pushed:
                a.request.stats.record_time(result.phase_ms, step_ms, result.rows, context)
                if piece:
                    events.append(self._emitted(a, piece, tuple(a.request.take_logprobs())))
                if a.request.stats.finish_reason:
                    self._finish(a, events)
        return events

    def abandon(self) -> None:
        """Drop every active request between steps without an answer (the caller stopped
        listening); the caches stay consistent, so the next request reuses them."""
        for a in list(self.active):
            self._release(a)

    def fail(self, active: list[_Active] | None, error: BaseException) -> list[Event]:
        """End requests (None: every active one) with an error; their caches are forgotten."""
        events: list[Event] = []
        for a in list(self.active if active is None else active):
            a.request.slot.target.reset()
            self._release(a)
            events.append(Failed(a.generation, error))
        return events

    def _finish(self, a: _Active, events: list[Event]) -> None:
        piece = self.engine.finish(a.request)
        rest = tuple(a.request.take_logprobs(final=True))
        if piece or rest:
            events.append(self._emitted(a, piece, rest))
        a.generation.result = a.request.result
        self._release(a)
        events.append(Done(a.generation, a.request.result))

    def _emitted(self, a: _Active, piece: str, logprobs: tuple) -> Emitted:
        """An Emitted event; a request's first carries its prompt's logprobs if it asked for them."""
        prompt = None
        if a.request.sampling.prompt_logprobs is not None and not a.prompt_sent:
            prompt, a.prompt_sent = tuple(a.request.prompt_logprobs), True
        return Emitted(a.generation, piece, logprobs, prompt)

    def _release(self, a: _Active) -> None:
        self.active.remove(a)
        index = a.request.slot.index
        self._free.add(index)
        self.engine.busy_slots.discard(index)
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
