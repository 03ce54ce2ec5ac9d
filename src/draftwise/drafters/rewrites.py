"""The edits an answer makes to the text it copies, learned where a copy resumes and made in the
lookup's later proposals (docs/design.md, section 3).

A whole-file edit copies its file with changes, and many changes repeat: a rename changes every
occurrence of a name, and each would otherwise break the copy (a forward that ends at the old
name, then plain steps while the lookup finds the source again past the new one). Where the
answer leaves a proposal's copy and, a few tokens later, copies the same source again, the
tokens in between are a change: `old` (what the source had) and `new` (what the answer wrote).
Later proposals that come to `old` make the change when the words around it are the same: with
the target's tokenizer, the word the change follows and the word characters after it (so `Clear`
-> `ClearValue` is not made inside `ClearEventParam`); without one, the token it follows.

A change is a proposal like any other (the target verifies it), so nothing here can change the
output. Each keeps a record of the proposals whose answer wrote it and of those whose answer did
not, and is made while it was right more often than wrong. A change seen once (where it was
learned) is made only while this request's changes were right more often than wrong in its
proposals, and a proposal that makes it ends after it; otherwise it waits to be seen a second
time. A one-off (a parameter added after `self`, a different docstring at each function) is
never made, and the first name of a rename from its third occurrence on.

Example: the source holds `parse_header(` and the answer wrote `parse_header_value(` (tokens
`_header`, `_value`, `(`): a later proposal of the source's `... parse_header)` reads
`... parse_header_value)`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from draftwise.backends.base import common_prefix_length

# A change is at most this many tokens on either side, and is learned only where the answer had
# followed the source for AGREE+ tokens before it and copies it again for RESUMED tokens after.
MAX_CHANGE = 8
AGREE = 4
RESUMED = 4
# Breaks awaiting the answer's return to the source, at most (the newest kept).
MAX_BREAKS = 4
# Tokens of text read around a change for the words it sits between.
WORD_TOKENS = 6

_LEADING = re.compile(r"^\w*")
_TRAILING = re.compile(r"\w*$")


@dataclass
class Change:
    old: tuple[int, ...]
    new: tuple[int, ...]
    after: str  # the word characters the text after `old` starts with ("" at a word's end)
    right: int = 0  # times the answer wrote `new` where the source had `old` (learned, or proposed)
    wrong: int = 0  # times it was proposed and the answer wrote something else

    @property
    def active(self) -> bool:
        return self.right >= 1 and self.wrong < self.right


class Rewrites:
    """Per request: the changes learned so far, and the last proposal awaiting its verdict."""

    def __init__(self) -> None:
        self.tokenizer = None
        self._pieces: dict[int, str] = {}
        self.reset()

    def reset(self, tokenizer=None) -> None:
        """A new request (with the target's tokenizer, if known)."""
        if tokenizer is not self.tokenizer:
            self.tokenizer, self._pieces = tokenizer, {}
        self.changes: dict[str | int, list[Change]] = {}
        # Cheap tests before a key is read: the tokens a change's `old` starts with, and the
        # tokens an insertion (no `old`) was seen to follow.
        self._firsts: set[int] = set()
        self._lefts: set[int] = set()
        # The last proposal not yet read to its end: (context length, tokens, each token's source
        # position (-1: a change's), [(offset, change made there)], tokens it followed the source,
        # whether it carried on a proposal that made a change).
        self._last: tuple[int, tuple[int, ...], Sequence[int], list[tuple[int, Change]], int, bool] | None = None
        # Where the answer last left a copy, newest last: (answer position, source position).
        self._breaks: list[tuple[int, int]] = []
        self.follow = None
        # Changes made in this request's proposals: [right, wrong]. A change seen once is made
        # only while they were right more often than wrong: a rename's are, once one was; an
        # answer that inserts a different docstring at each function (a one-off each time) is not.
        self._made = [0, 0]

    #: When the answer follows a proposal that made a change: (source position to go on copying
    #: from, tokens the answer has followed that source, the change's tokens still to write first,
    #: its changes not yet judged); else None.
    follow: tuple[int, int, tuple[int, ...], list[tuple[int, Change]]] | None = None

    def __len__(self) -> int:
        return sum(len(v) for v in self.changes.values())

    def _piece(self, token: int) -> str:
        piece = self._pieces.get(token)
        if piece is None:
            try:
                piece = self.tokenizer.decode([token])
            except Exception:  # a token with no text of its own (a control token)
                piece = "\x00"
            self._pieces[token] = piece
        return piece

    def _key(self, tokens: Sequence[int], end: int) -> str | int:
        """What a change after tokens[:end] is keyed by: the word characters the text ends with
        (`"parse_header"`, a tokenization's first token with or without its space alike), or
        the last token where that is none (after punctuation) or there is no tokenizer."""
        if self.tokenizer is None or end <= 0:
            return tokens[end - 1] if end > 0 else -1
        text = "".join(self._piece(t) for t in tokens[max(0, end - WORD_TOKENS) : end])
        word = _TRAILING.search(text).group()
        return word or tokens[end - 1]

    def _after(self, tokens: Sequence[int], start: int) -> str:
        if self.tokenizer is None:
            return ""
        text = "".join(self._piece(t) for t in tokens[start : start + WORD_TOKENS])
        return _LEADING.match(text).group()

    def observe(self, tokens: Sequence[int]) -> None:
        """Read what the answer wrote since the last proposal (`tokens`: the context now): the
        verdicts on the changes it made, where the answer left the source it copied, and whether
        the answer has resumed that source since, a change apart."""
        last = self._last
        self.follow = None
        if last is not None:
            start, proposal, sources, sites, aligned, carried = last
            written = tokens[start : start + len(proposal)]
            followed = common_prefix_length(written, proposal)
            kept = []
            for offset, change in sites:
                end = min(len(proposal), offset + max(1, len(change.new)))  # a deletion: the token after it
                if followed >= end:
                    change.right += 1
                    self._made[0] += 1
                elif offset <= followed < len(written):
                    change.wrong += 1  # the answer reached the change and wrote something else
                    self._made[1] += 1
                else:
                    kept.append((offset, change))  # not reached yet
            if followed < len(written):
                self._last = None
                # A copy of AGREE+ tokens broke at a copied token: a change may start here.
                if aligned + followed >= AGREE and sources[followed] >= 0:
                    self._breaks = [*self._breaks[1 - MAX_BREAKS :], (start + followed, sources[followed])]
            else:
                self._last = (start, proposal, sources, kept, aligned, carried) if followed < len(proposal) else None
                # The answer follows a change this proposal (or one it carried on) made: go on
                # with it (a new lookup would match the changed text elsewhere), the rest of the
                # change first.
                resume = next((j for j in range(followed, len(proposal)) if sources[j] >= 0), -1)
                if followed and resume >= 0 and (carried or min(sources[:followed]) < 0):
                    rest = [(offset - followed, change) for offset, change in kept]
                    self.follow = (sources[resume], aligned + followed, proposal[followed:resume], rest)
        if self._breaks:
            self._breaks = [b for b in self._breaks if not self._resumed(tokens, *b)]

    def _resumed(self, tokens: Sequence[int], at: int, source: int) -> bool:
        """Whether a break is settled: the answer went elsewhere, or it copies RESUMED tokens of
        the source again, a change apart (the smallest that explains it, learned)."""
        written = len(tokens) - at
        best = None
        for p in range(min(MAX_CHANGE, written - RESUMED) + 1):
            token = tokens[at + p]
            for q in range(min(MAX_CHANGE, at - RESUMED - source) + 1):
                if (best is None or (p + q, p) < best) and (p or q) and tokens[source + q] == token:
                    if tokens[at + p : at + p + RESUMED] == tokens[source + q : source + q + RESUMED]:
                        best = (p + q, p)
        if best is None:
            return written >= MAX_CHANGE + RESUMED  # no change explains it: the answer went elsewhere
        p, q = best[1], best[0] - best[1]
        old, new = tuple(tokens[source : source + q]), tuple(tokens[at : at + p])
        key, after = self._key(tokens, at), self._after(tokens, source + q)
        for change in self.changes.setdefault(key, []):
            if change.old == old and change.new == new and change.after == after:
                change.right += 1
                return True
        self.changes[key].append(Change(old, new, after, right=1))
        if old:
            self._firsts.add(old[0])
        else:
            self._lefts.add(tokens[at - 1])
        return True

    def apply(
        self,
        tokens: Sequence[int],
        start: int,
        max_tokens: int,
        aligned: int,
        first: Sequence[int] = (),
        sites: Sequence[tuple[int, Change]] = (),
        carried: bool = False,
    ) -> list[int]:
        """Up to max_tokens tokens copied from tokens[start:] (which follow the context, all of
        `tokens`, whose last `aligned` tokens match those before `start`), with the active
        changes made; `first`, the rest of a change, and its `sites` before them, where the
        proposal `carried` on one that made a change (self.follow)."""
        changes, firsts, lefts = self.changes, self._firsts, self._lefts
        context_len, i, end = len(tokens), start, len(tokens)
        if not changes:
            out = list(tokens[start : start + max_tokens])
            self._last = (context_len, tuple(out), range(start, start + len(out)), [], aligned, False)
            return out
        out: list[int] = list(first)
        sources: list[int] = [-1] * len(first)  # each token's source position (-1: a change's)
        sites = list(sites)
        emitted = [*tokens[max(0, context_len - WORD_TOKENS) :], *first]  # the text the proposal follows
        while len(out) < max_tokens and i < end:
            made = None
            maybe = tokens[i] in firsts or emitted[-1] in lefts
            for change in changes.get(self._key(emitted, len(emitted)), ()) if maybe else ():
                old, new = change.old, change.new
                if (
                    change.active
                    and (change.right >= 2 or self._made[1] < self._made[0])
                    and tuple(tokens[i : i + len(old)]) == old
                    and (not new or tuple(tokens[i : i + len(new)]) != new)
                    and self._after(tokens, i + len(old)) == change.after
                ):
                    made = change
                    break
            if made is None:
                out.append(tokens[i])
                sources.append(i)
                emitted.append(tokens[i])
                i += 1
                continue
            sites.append((len(out), made))
            out.extend(made.new)
            sources.extend([-1] * len(made.new))
            emitted.extend(made.new)
            i += len(made.old)
            if i < end:  # what follows a change is copied as it is
                out.append(tokens[i])
                sources.append(i)
                emitted.append(tokens[i])
                i += 1
            if made.right < 2:
                break  # a change seen once may be a one-off: the proposal ends after it
        out = out[:max_tokens]
        sites = [(o, c) for o, c in sites if o < len(out)]
        self._last = (context_len, tuple(out), sources[: len(out)], sites, aligned, carried)
        return out
