"""Prompt lookup (n-gram) drafter: copy what followed an earlier occurrence of the suffix.

An incremental index maps each n-gram (min_n <= n <= max_n) to the positions that
follow it, updated with new tokens only (O(1) per token, no rescans). Among matches
of the longest n, the one whose match extends furthest backwards wins (ties: the
earliest) — on "copy this code with one change" that is the right source to copy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from draftwise.backends.base import common_prefix_length
from draftwise.drafters.base import DICT_ENTRY, INT, LIST_SLOT, NEW_LIST, BaseDrafter, Follower, tuple_bytes
from draftwise.drafters.rewrites import Rewrites
from draftwise.types import Draft, TreeDraft

MAX_CANDIDATES = 64  # occurrences scored per lookup (newest kept when there are more)
MAX_BACKWARD = 256  # how far a match is extended backwards when scoring


class NgramDrafter(BaseDrafter):
    """Prompt lookup decoding over prompt + generated text.

    Example: context [1, 2, 3, 9, 1, 2] with min_n=1, max_n=2 -> the suffix (1, 2)
    occurred at 0..1, followed by [3, 9, 1, 2]; propose(context, 3) -> Draft((3, 9, 1)).
    """

    free = True

    def __init__(self, min_n: int = 2, max_n: int = 4, name: str = "ngram", rewrites: bool = True) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram sizes need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n, self.name = min_n, max_n, name
        # The answer's own edits of what it copies, made in later proposals (drafters/rewrites.py).
        self.rewrites = Rewrites() if rewrites else None
        self._tokens: list[int] = []
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {}
        self.last_match_length = 0
        self._follow = Follower()
        self.reset()

    def reset(self) -> None:
        self._tokens = []
        self._index = {n: defaultdict(list) for n in range(self.min_n, self.max_n + 1)}

    def for_slot(self, slot: int) -> NgramDrafter:
        return NgramDrafter(self.min_n, self.max_n, self.name, self.rewrites is not None)

    def memory_bytes(self) -> int:
        """The index of the last context it was shown: a list slot per token (the ids are the
        context's own objects), and per n a position per token and a key per distinct n-gram.
        An upper estimate: 6-15% above tracemalloc's count at 10k+ tokens, up to 50% on short
        contexts (positions under 257 are CPython's cached ints).

        Bounded by the context, so by the target's n_ctx: the index holds one context, the last
        shown (a new request keeps what it shares with it). At most about 0.7 KB a token for
        n = 2..4 (every n-gram new), 23 MB at 32k tokens; about half that on text that repeats
        itself. MAX_CANDIDATES caps the occurrences one lookup scores: the work of a step at long
        context, not the memory."""
        t = len(self._tokens)
        total = t * LIST_SLOT
        for n, table in self._index.items():
            total += max(0, t - n + 1) * (INT + LIST_SLOT) + len(table) * (tuple_bytes(n) + NEW_LIST + DICT_ENTRY)
        return total

    def begin(self, sampling, speculation, prompt=(), tokenizer=None) -> None:
        self._follow.begin()
        if self.rewrites is not None:
            self.rewrites.reset(tokenizer)

    def _sync(self, context: Sequence[int]) -> None:
        # The index survives from one request to the next: a new request's context keeps what it
        # shares with the last one, and only the rest is taken back (O(tokens dropped)).
        known = len(self._tokens)
        if not self._follow.trusts(len(context), known):
            same = common_prefix_length(context, self._tokens)
            if same < known:
                self._truncate(same)
                known = same
            self._follow.compared()
        for i in range(known, len(context)):
            self._tokens.append(int(context[i]))
            for n, table in self._index.items():
                if i + 1 >= n:  # n-gram ending at i; its continuation starts at i + 1
                    table[tuple(self._tokens[i + 1 - n : i + 1])].append(i + 1)

    def _truncate(self, keep: int) -> None:
        """Forget the tokens from `keep` on: each one's n-grams were the last entries appended."""
        tokens = self._tokens
        for i in range(len(tokens) - 1, keep - 1, -1):
            for n, table in self._index.items():
                if i + 1 >= n:
                    key = tuple(tokens[i + 1 - n : i + 1])
                    table[key].pop()
                    if not table[key]:
                        del table[key]
        del tokens[keep:]

    def matches(self, context: Sequence[int]) -> list[tuple[int, int]]:
        """(start of continuation, backward match length) for the longest n with a match,
        best first: longest backward match, then earliest."""
        self._sync(context)
        tokens, end = self._tokens, len(self._tokens)
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            positions = self._index[n].get(tuple(tokens[end - n :]))
            if not positions:
                continue
            found = []
            for start in positions[-MAX_CANDIDATES:]:
                if start >= end:
                    continue  # the suffix itself
                length = n
                while (
                    length < MAX_BACKWARD
                    and start - length - 1 >= 0
                    and tokens[start - length - 1] == tokens[end - length - 1]
                ):
                    length += 1
                found.append((start, length))
            if found:
                return sorted(found, key=lambda f: (-f[1], f[0]))
        return []

    def propose_tree(self, context: Sequence[int], max_tokens: int, max_branches: int) -> TreeDraft:
        """Up to max_branches distinct continuations from the best-scoring occurrences."""
        branches: list[tuple[int, ...]] = []
        best_len = 0
        for start, length in self.matches(context):
            branch = tuple(self._tokens[start : start + max_tokens])
            if branch and branch not in branches:
                branches.append(branch)
                best_len = max(best_len, length)
            if len(branches) >= max_branches:
                break
        return TreeDraft(tuple(branches), source=self.name, score=float(best_len))

    def propose(self, context: Sequence[int], max_tokens: int, grammar=None) -> Draft:
        found = self.matches(context)
        start, length = found[0] if found else (-1, 0)
        tokens = self._tokens
        rewrites = self.rewrites if self._follow.in_request else None  # an answer's edits: in a request
        score = _margin(tokens, found) if found else 0
        first, sites = (), ()
        if rewrites is not None:
            rewrites.observe(tokens)
            if rewrites.follow is not None:  # the answer follows a change this drafter proposed
                start, length, first, sites = rewrites.follow
                score = length = min(length, MAX_BACKWARD)
        self.last_match_length = length
        if start < 0 or max_tokens <= 0:
            return Draft((), source=self.name)
        if rewrites is None:
            proposal = tokens[start : start + max_tokens]
        else:
            proposal = rewrites.apply(tokens, start, max_tokens, length, first, sites, rewrites.follow is not None)
        return Draft(tuple(proposal), source=self.name, score=float(score), origin=start)


def _margin(tokens: Sequence[int], found: Sequence[tuple[int, int]]) -> int:
    """The best match's backward length less that of the longest match that goes on with another
    token (a rival): the evidence that tells this source from the others. In a long context a
    phrase recurs with many continuations ("self." in 28k tokens of source), so a long match can
    be as ambiguous as a short one. Example: best (10, 12) continuing with 5, a rival of length
    9 continuing with 7 -> 3; no rival -> 12."""
    start, length = found[0]  # matches() keeps only starts before the context's end
    rival = max((n for s, n in found[1:] if tokens[s] != tokens[start]), default=0)
    return max(1, length - rival) if rival else length
