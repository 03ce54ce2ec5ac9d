"""Suffix/history drafter (after SuffixDecoding, arXiv 2411.04975).

Indexes the current context and earlier requests' contexts (bounded: oldest evicted)
and proposes, for the longest suffix of the context found there, the most frequent
observed continuation. Agent and coding workloads repeat themselves across requests.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence

from draftwise.backends.base import common_prefix_length
from draftwise.drafters.base import (
    DICT_ENTRY,
    INT,
    LIST_SLOT,
    NEW_LIST,
    POINTER,
    BaseDrafter,
    Follower,
    tuple_bytes,
)
from draftwise.drafters.continuation import frequency_walk
from draftwise.types import Draft

SEPARATOR = -1  # between documents: no match or continuation crosses it
MAX_CANDIDATES = 128
MAX_BACKWARD = 64
# A live-context match beats a history match unless that is longer by more than this.
LIVE_BONUS = 8


class SuffixDrafter(BaseDrafter):
    """Example: after a request whose text was [1, 2, 3, 4], a new context [9, 2, 3]
    gets the proposal (4,) — the continuation seen after (2, 3) in history.
    """

    free = True

    def __init__(
        self, max_history_tokens: int = 200_000, min_n: int = 2, min_confidence: float = 0.2, name: str = "suffix"
    ) -> None:
        self.max_history_tokens, self.min_n = max_history_tokens, min_n
        self.min_confidence, self.name = min_confidence, name
        self._docs: deque[list[int]] = deque()  # finished contexts, oldest first
        self._tokens: list[int] = []  # all docs + the live context, separated by SEPARATOR
        self._index: dict[tuple[int, ...], list[int]] = defaultdict(list)  # n-gram -> continuation starts
        self._live_start = 0  # where the live (current) context begins in _tokens
        self._num_positions = 0  # continuation starts held in _index (memory_bytes)
        self.last_confidences: list[float] = []
        self.last_kind = ""  # "live" or "history": where the last match was found
        self._follow = Follower()

    # ---------------------------------------------------------------- index upkeep
    def _append(self, token: int) -> None:
        self._tokens.append(token)
        end = len(self._tokens)
        if end - self._live_start >= self.min_n:
            self._index[tuple(self._tokens[end - self.min_n :])].append(end)
            self._num_positions += 1

    def _rebuild(self) -> None:
        live = self._tokens[self._live_start :]
        self._tokens, self._index, self._num_positions = [], defaultdict(list), 0
        for doc in self._docs:
            self._live_start = len(self._tokens)
            for t in doc:
                self._append(t)
            self._tokens.append(SEPARATOR)
        self._live_start = len(self._tokens)
        for t in live:
            self._append(t)

    def _retire_live(self) -> None:
        live = self._tokens[self._live_start :]
        if live:
            self._docs.append(live)
            self._tokens.append(SEPARATOR)
            self._live_start = len(self._tokens)
        total = sum(len(d) for d in self._docs)
        if total > self.max_history_tokens:
            while self._docs and total > self.max_history_tokens:
                total -= len(self._docs.popleft())
            self._rebuild()

    def begin(self, sampling, speculation, prompt=(), tokenizer=None) -> None:
        self._follow.begin()

    def _sync(self, context: Sequence[int]) -> None:
        n = len(self._tokens) - self._live_start
        if not self._follow.trusts(len(context), n):
            if len(context) < n or common_prefix_length(context, self._tokens[self._live_start :]) < n:
                self._retire_live()
                n = 0
            self._follow.compared()
        for t in context[n:]:
            self._append(int(t))

    def snapshot(self) -> tuple:
        """The history state, for restore(): benchmarks start every method from the same one."""
        return (list(self._docs), list(self._tokens), {k: list(v) for k, v in self._index.items()}, self._live_start)

    def restore(self, state: tuple) -> None:
        docs, tokens, index, live_start = state
        self._docs, self._tokens, self._live_start = deque(docs), list(tokens), live_start
        self._index = defaultdict(list, {k: list(v) for k, v in index.items()})
        self._num_positions = sum(len(v) for v in self._index.values())
        self._follow.checked = False  # the next context is compared with the restored one in full

    @property
    def num_history_tokens(self) -> int:
        return sum(len(d) for d in self._docs)

    def memory_bytes(self) -> int:
        """History and live context: a list slot per token in the joined list and again in its
        document's list (the ids are the contexts' own objects), a position per token and a key
        per distinct min_n-gram. An upper estimate, like NgramDrafter's.

        Bounded: the history keeps at most max_history_tokens (200k by default; the oldest
        documents go first), the live context at most the target's n_ctx. At most about 0.25 KB
        a token (every n-gram new; 0.13 KB on text that repeats itself): 50 MB at the default
        cap, plus the live context. Each slot's drafter has a history of its own."""
        docs = len(self._docs)
        return (
            len(self._tokens) * LIST_SLOT
            + docs * (NEW_LIST + POINTER)
            + self.num_history_tokens * POINTER
            + self._num_positions * (INT + LIST_SLOT)
            + len(self._index) * (tuple_bytes(self.min_n) + NEW_LIST + DICT_ENTRY)
        )

    # ---------------------------------------------------------------- drafting

    def for_slot(self, slot: int) -> SuffixDrafter:
        """A drafter for another slot, with a history of its own: a slot's next request is
        mostly the same conversation (slots are chosen by cached prefix)."""
        return SuffixDrafter(self.max_history_tokens, self.min_n, self.min_confidence, self.name)

    def _token_at(self, p: int) -> int | None:
        if p >= len(self._tokens):
            return None
        t = self._tokens[p]
        return None if t == SEPARATOR else t

    def match(self, context: Sequence[int]) -> tuple[list[int], int]:
        """Continuation starts of the longest matching suffix, and its length.

        A match in the live context wins unless history's is over LIVE_BONUS tokens longer:
        a text mostly copies from itself (the document being edited, the earlier turns),
        and a slightly longer match in another request's text is usually boilerplate that
        continues differently. Replaying the full suite's answers (`draftwise replay`),
        longest-anywhere lost 5 points of speedup on code_edit against this rule.
        """
        self._sync(context)
        tokens, end = self._tokens, len(self._tokens)
        self.last_kind = ""
        if end - self._live_start < self.min_n:
            return [], 0
        starts = self._index.get(tuple(tokens[end - self.min_n :]), [])
        live_best: list[int] = []
        hist_best: list[int] = []
        live_best_len = hist_best_len = 0
        live_len = end - self._live_start
        for start in starts[-MAX_CANDIDATES:]:
            if start >= end or tokens[start] == SEPARATOR:  # no continuation to propose
                continue
            # Longest L with tokens[start-L:start] == tokens[end-L:end]: equality is monotone in
            # L, so binary search with slice comparisons (in C). The live side holds no
            # SEPARATOR, so a match never reaches back across a document boundary.
            lo, hi = self.min_n, min(MAX_BACKWARD, start, live_len)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if tokens[start - mid : start] == tokens[end - mid : end]:
                    lo = mid
                else:
                    hi = mid - 1
            if start > self._live_start:
                if lo > live_best_len:
                    live_best, live_best_len = [start], lo
                elif lo == live_best_len:
                    live_best.append(start)
            elif lo > hist_best_len:
                hist_best, hist_best_len = [start], lo
            elif lo == hist_best_len:
                hist_best.append(start)
        if live_best and live_best_len + LIVE_BONUS >= hist_best_len:
            self.last_kind = "live"
            return live_best, live_best_len
        if hist_best:
            self.last_kind = "history"
        return hist_best, hist_best_len

    def propose(self, context: Sequence[int], max_tokens: int, grammar=None) -> Draft:
        positions, length = self.match(context)
        self.last_confidences = []
        if not positions or max_tokens <= 0:
            return Draft((), source=self.name)
        proposal, confidences = frequency_walk(self._token_at, positions, max_tokens, self.min_confidence)
        self.last_confidences = confidences
        origin = positions[0] if len(positions) == 1 else -1  # several sources: walked by majority
        return Draft(tuple(proposal), source=self.name, score=float(length), kind=self.last_kind, origin=origin)
