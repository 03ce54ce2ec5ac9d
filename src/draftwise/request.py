"""A request's life, one name per stage (docs/design.md section 1).

Validated: Engine.stream checks the caller's input against the engine and freezes it as a ValidRequest.
Handed out: the caller gets a Generation, the iterator of the request's text pieces.
Running: a Batcher binds it to a free Slot (SlotPool.start) as a RunningRequest, which each step advances.
Done: SlotPool.finish closes the RunningRequest into a Result, which the Generation holds as `.result`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from draftwise.backends.base import Backend
from draftwise.drafters.base import Drafter
from draftwise.metrics import RequestStats
from draftwise.policy.base import Policy
from draftwise.sampling import TokenLogprob
from draftwise.types import SamplingParams, SpeculationConfig, TokenSpan

if TYPE_CHECKING:
    from draftwise.constraints import Grammar


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: RequestStats
    prompt_ids: list[int] = field(default_factory=list)
    # Asked for (SamplingParams.logprobs / prompt_logprobs): one per generated token (cut where
    # a stop string cut the text), and one per prompt token after the first.
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None
    # Asked for (token_sources): the text as spans, each with the token and step that wrote it.
    spans: list[TokenSpan] | None = None

    @property
    def finish_reason(self) -> str:
        return self.stats.finish_reason

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, **self.stats.to_dict()}


@dataclass(frozen=True)
class ValidRequest:
    """A request checked against the engine (prompt fits, drafters exist, constraint compiles and
    admits an answer), not yet bound to a slot."""

    prompt_ids: list[int]
    sampling: SamplingParams
    speculation: SpeculationConfig
    cancelled: Callable[[], bool] | None
    drafters: tuple[str, ...] | None  # a subset by name; None: all
    grammar: Grammar | None
    token_sources: bool = False  # stream each token's source (TokenSpans) beside its text


class Generation:
    """The caller's handle on one request: an iterator of text pieces; after it is exhausted,
    `.result` holds the Result.

    `.request` is the ValidRequest: a Batcher may run it in a slot instead (then the Generation
    is not iterated, and the Batcher sets `.result` when the request is done). Iterated, `.spans`
    holds the TokenSpans of the text streamed so far (when the request asks for token sources)."""

    def __init__(self, request: ValidRequest, pieces: Callable[[Generation], Iterator[str]]) -> None:
        self.request = request
        self.result: Result | None = None
        self.spans: list[TokenSpan] = []
        self._pieces = pieces(self)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        """Abandon the request between steps; the engine stays ready for the next one."""
        self._pieces.close()


@dataclass
class Slot:
    """A target sequence and the drafters that follow its requests (per-request state)."""

    index: int
    target: Backend
    drafters: list[Drafter]


class StreamDecoder:
    """Incremental detokenisation that never emits half a UTF-8 character."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self._prefix, self._read = 0, 0

    def push(self, ids: Sequence[int]) -> None:
        self.ids.extend(ids)
        prefix_text = self.tokenizer.decode(self.ids[self._prefix : self._read])
        new_text = self.tokenizer.decode(self.ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.text += new_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self.ids)

    def flush(self) -> None:
        tail = self.tokenizer.decode(self.ids[self._prefix :])
        prefix_text = self.tokenizer.decode(self.ids[self._prefix : self._read])
        if len(tail) > len(prefix_text):
            self.text += tail[len(prefix_text) :]
        self._prefix = self._read = len(self.ids)


@dataclass
class RunningRequest:
    """A request bound to its slot, between steps: what the step reads and advances, and what
    the Batcher keeps of it (its prompt still to read, when it was admitted).

    greedy and trees are decided once, when the request is bound to its slot: greedy is the
    sampling's; trees (several branches verified in one pass) need greedy decoding, no
    grammar, a target that verifies trees and a speculation that asks for branches."""

    generation: Generation  # the caller's handle: the Batcher's events name it
    sampling: SamplingParams
    context: list[int]  # prompt + committed tokens
    rng: np.random.Generator
    policy: Policy
    stats: RequestStats
    slot: Slot
    decoder: StreamDecoder
    greedy: bool
    grammar: Grammar | None = None
    trees: bool = False
    fast_forward: bool = True  # commit grammar-forced tokens without a decision (speculation on)
    generated: list[int] = field(default_factory=list)
    drafters: list[Drafter] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    stop_hold: int = 0
    eos_ids: frozenset[int] = frozenset()
    cancelled: Callable[[], bool] | None = None
    emitted: int = 0  # characters of text streamed so far
    stop_at: int | None = None
    t_decode: float = 0.0
    pending: list[int] = field(default_factory=list)  # prompt tokens not yet in the slot's cache
    admitted_at: float = field(default_factory=time.perf_counter)
    prompt_sent: bool = False  # its prompt logprobs went out (with its first text)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)  # the step's, before push
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated token (if asked)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # prompt tokens 2.. (if asked)
    logprobs_taken: int = 0  # logprobs handed to the stream so far
    # Where the step's tokens came from (commit sets them, push reads them): a source per
    # forced + committed token, and the step's (drafted, accepted).
    pending_sources: tuple[str, ...] = ()
    pending_step: tuple[int, int] = (0, 0)
    # token_sources: per generated token its source, its step (index into steps) and where its
    # text ends in the decoded text; spans_chars / spans_token: what take_spans handed out.
    trace: bool = False
    token_sources: list[str] = field(default_factory=list)
    token_steps: list[int] = field(default_factory=list)
    steps: list[tuple[int, int]] = field(default_factory=list)
    text_ends: list[int] = field(default_factory=list)
    spans_chars: int = 0
    spans_token: int = 0

    def push(self, new_ids: list[int] | None) -> str:
        """Stop conditions, token by token, for a step's tokens (None: nothing fits any more);
        returns the text now safe to stream (held back: a possible stop string's start, half a
        UTF-8 character)."""
        stats, sampling = self.stats, self.sampling
        if new_ids is None:
            stats.finish_reason = "length"
            return ""
        pending, self.pending_logprobs = self.pending_logprobs, []
        sources, self.pending_sources = self.pending_sources, ()
        decoder, trace = self.decoder, self.trace
        if trace:
            self.steps.append(self.pending_step)
        for j, token in enumerate(new_ids):
            if j < len(pending):
                self.logprobs.append(pending[j])  # EOS's too; take_logprobs() drops it
            if token in self.eos_ids:
                stats.finish_reason = "stop"
                stats.num_eos = 1
                break
            self.generated.append(token)
            self.context.append(token)
            source = sources[j] if j < len(sources) else "target"
            stats.tokens_by_source[source] += 1
            if trace:  # one token at a time, to know where each one's text ends
                decoder.push((token,))
                self.token_sources.append(source)
                self.token_steps.append(len(self.steps) - 1)
                self.text_ends.append(len(decoder.text))
            if len(self.generated) >= sampling.max_tokens:
                stats.finish_reason = "length"
                break
        if not trace:
            decoder.push(self.context[len(self.prompt_ids) + len(decoder.ids) :])
        if sampling.stop:
            self.stop_at = find_stop(decoder.text, sampling.stop, self.emitted - self.stop_hold)
            if self.stop_at is not None:
                stats.finish_reason = "stop"
        if stats.finish_reason:
            return ""
        ready = len(decoder.text) - self.stop_hold
        if ready <= self.emitted:
            return ""
        piece, self.emitted = decoder.text[self.emitted : ready], ready
        return piece

    def take_logprobs(self, final: bool = False) -> list[TokenLogprob]:
        """The logprobs of generated tokens not yet handed out whose text has been streamed (all
        of them at the end, cut at a stop string); [] when the request asks for none."""
        if self.sampling.logprobs is None:
            return []
        if final:
            end = self.num_text_tokens()
        else:
            end = len(self.generated)
            while end > self.logprobs_taken and len(self.tokenizer_text(end)) > self.emitted:
                end -= 1  # its text is held back (a possible stop string, half a character)
        taken = self.logprobs[self.logprobs_taken : end]
        self.logprobs_taken = max(self.logprobs_taken, end)
        return taken

    def take_spans(self, end: int) -> tuple[TokenSpan, ...]:
        """The TokenSpans of the text from what was handed out so far up to character `end`
        (() unless the request asks for token sources)."""
        if not self.trace:
            return ()
        spans, self.spans_chars, self.spans_token = self._spans(self.spans_chars, end, self.spans_token)
        return tuple(spans)

    def _spans(self, at: int, end: int, i: int) -> tuple[list[TokenSpan], int, int]:
        """Spans of text[at:end], starting from token i; returns them, where they end, and the
        first token not wholly in them."""
        spans, text, ends = [], self.decoder.text, self.text_ends
        while i < len(ends) and at < end:
            stop = min(ends[i], end)
            if stop > at:
                drafted, accepted = self.steps[self.token_steps[i]]
                logprob = self.logprobs[i].logprob if i < len(self.logprobs) else None
                spans.append(
                    TokenSpan(text[at:stop], self.token_sources[i], self.token_steps[i] + 1, drafted, accepted, logprob)
                )
                at = stop
            if ends[i] > end:
                break
            i += 1
        return spans, at, i

    def all_spans(self, end: int) -> list[TokenSpan] | None:
        """The spans of the whole text up to character `end`; None without token sources."""
        return self._spans(0, end, 0)[0] if self.trace else None

    def tokenizer_text(self, n: int) -> str:
        return self.decoder.tokenizer.decode(self.generated[:n])

    def num_text_tokens(self) -> int:
        """How many generated tokens the final text shows (all but those a stop string cut off)."""
        if self.stop_at is None:
            return len(self.generated)
        lo, hi = 0, len(self.generated)  # the first n whose text reaches past the cut
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.tokenizer_text(mid)) >= self.stop_at:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def flush(self) -> str:
        """The whole text at the end: the last bytes flushed, cut at a stop string."""
        decoder, sampling = self.decoder, self.sampling
        if self.stop_at is None:
            decoder.flush()
            if self.text_ends:  # the last bytes are the last token's
                self.text_ends[-1] = len(decoder.text)
            if sampling.stop:
                self.stop_at = find_stop(decoder.text, sampling.stop, self.emitted - self.stop_hold)
        return decoder.text if self.stop_at is None else decoder.text[: self.stop_at]


def find_stop(text: str, stops: Sequence[str], start: int) -> int | None:
    """Index of the earliest stop string in text at or after start (clamped), else None.
    Example: ("ab END cd", ["END"], 0) -> 3."""
    start = max(0, start)
    best = None
    for s in stops:
        i = text.find(s, start)
        if i >= 0 and (best is None or i < best):
            best = i
    return best
