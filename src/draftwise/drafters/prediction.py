"""Prediction drafter: the request's predicted output (OpenAI `prediction`) as a free draft.

It keeps an alignment into the prediction: while the output follows it, the next tokens of
the prediction are the draft. After a mismatch (the answer inserted, deleted or changed
something) it re-synchronises the way a diff finds its next common line: the longest recent
n-gram of the output that occurs in the prediction at or after the last aligned point,
nearest first, marks where the output rejoined it. Until then it proposes nothing.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from draftwise.backends.base import Tokenizer
from draftwise.drafters.base import DICT_ENTRY, INT, LIST_SLOT, NEW_LIST, BaseDrafter, tuple_bytes
from draftwise.types import Draft, SamplingParams, SpeculationConfig

if TYPE_CHECKING:
    from draftwise.constraints import Grammar

ANCHOR_MIN, ANCHOR_MAX = 2, 8  # n-gram lengths that can re-anchor the alignment
# Score of a proposal: tokens matched in a row since the last (re)alignment, plus this much
# at the start of the answer, where the prediction is the user's own statement of it.
START_SCORE = 8
# Occurrences of an anchor looked at per re-alignment (nearest first): bounds a step's work on a
# prediction that repeats itself; the alignment only decides what is drafted, never the output.
MAX_CANDIDATES = 4096


class PredictionDrafter(BaseDrafter):
    """Example: prediction [5, 6, 7, 8, 9], answer so far [5, 6, 4, 7, 8] (4 inserted): the
    alignment breaks at 4, the anchor (7, 8) rejoins it, so the next proposal is (9,).
    """

    free = True

    def __init__(self, name: str = "prediction") -> None:
        self.name = name
        self.prediction: tuple[int, ...] = ()
        self._index: dict[tuple[int, ...], list[int]] = {}  # n-gram -> positions just after it
        self._seen = -1  # context length already processed (-1: before the first proposal)
        self._pos: int | None = 0  # next expected prediction index; None while out of sync
        self._floor = 0  # the last aligned point: re-anchoring looks from here on
        self._run = START_SCORE  # matched tokens in a row (the proposal's score)

    def for_slot(self, slot: int) -> PredictionDrafter:
        return PredictionDrafter(self.name)

    def memory_bytes(self) -> int:
        """The request's prediction and its index of ANCHOR_MIN-grams (a position per token, a key
        per distinct one); an upper estimate, like NgramDrafter's. Bounded by the prediction,
        which the engine cuts to the target's n_ctx tokens: at most about 0.22 KB a token, 7 MB
        at 32k. Replaced by the next request's (begin)."""
        n = len(self.prediction)
        positions = max(0, n - ANCHOR_MIN + 1)
        keys = len(self._index)
        return tuple_bytes(n) + positions * (INT + LIST_SLOT) + keys * (tuple_bytes(ANCHOR_MIN) + NEW_LIST + DICT_ENTRY)

    def begin(
        self,
        sampling: SamplingParams,
        speculation: SpeculationConfig,
        prompt: Sequence[int] = (),
        tokenizer: Tokenizer | None = None,
    ) -> None:
        self.prediction = tuple(speculation.prediction)
        # One index, of the shortest anchors: a longer anchor ends with one of them, so it is
        # checked against the prediction itself (7 indexes cost seconds and GBs on long texts).
        index: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for end in range(ANCHOR_MIN, len(self.prediction) + 1):
            index[self.prediction[end - ANCHOR_MIN : end]].append(end)
        self._index = dict(index)
        self._seen, self._pos, self._floor, self._run = -1, 0, 0, START_SCORE

    def _follow(self, context: Sequence[int]) -> None:
        """Advance the alignment over the tokens committed since the last call."""
        if self._seen < 0 or self._seen > len(context):
            self._seen = len(context)  # the answer starts here
            return
        for token in context[self._seen :]:
            if self._pos is not None and self._pos < len(self.prediction) and self.prediction[self._pos] == token:
                self._pos += 1
                self._run += 1
            elif self._pos is not None:
                self._floor, self._pos, self._run = self._pos, None, 0
        self._seen = len(context)
        if self._pos is None:
            self._pos = self._anchor(context)

    def _anchor(self, context: Sequence[int]) -> int | None:
        """Where the output rejoined the prediction: the end of the longest recent output n-gram
        found in the prediction at or after the last aligned point (nearest wins), or None."""
        if len(context) < ANCHOR_MIN:
            return None
        ends = self._index.get(tuple(context[-ANCHOR_MIN:]), ())
        for n in range(min(ANCHOR_MAX, len(context)), ANCHOR_MIN - 1, -1):
            tail = tuple(context[-n:])
            # ends ascend, so the first match at or after the floor is the nearest.
            start = bisect_left(ends, self._floor + n)
            for e in ends[start : start + MAX_CANDIDATES]:
                if self.prediction[e - n : e] == tail:
                    self._run = n
                    return e
        return None

    def propose(self, context: Sequence[int], max_tokens: int, grammar: Grammar | None = None) -> Draft:
        if not self.prediction:
            return Draft((), source=self.name)
        self._follow(context)
        if self._pos is None or max_tokens <= 0:
            return Draft((), source=self.name)
        tokens = self.prediction[self._pos : self._pos + max_tokens]
        return Draft(tokens, source=self.name, score=float(self._run))

    def accept(self, num_accepted: int) -> None:
        pass  # the alignment follows the committed context itself
