"""Acceptance estimates the auto policy plans with: per draft position for a draft model
(AcceptanceEstimate), by match length for a lookup that copies earlier text (CopyEstimate),
and E(k), the expected committed tokens of a k-token draft, from either.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# A lookup copies: its proposal continues an earlier occurrence of the text just written (the
# file being edited, the prediction, an earlier turn). Whether its next token is right depends
# on how long the copy has held, so its estimate is a hazard by match length (CopyEstimate):
# c(L) = P(right | the L tokens before it matched the source), L = the proposal's backward match
# length + its position in the draft. Prior c(L) by bucket of L:
COPY_BUCKETS = (1, 2, 3, 4, 5, 8, 16, 32, 64, 128)
COPY_PRIORS = (0.25, 0.35, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97)
# Continuations of a short match (backward match length below COPY_SPLIT) and of a long one
# are learned apart: JSON keys and boilerplate give short matches that diverge soon after, an
# unchanged stretch of a file being edited long ones that do not.
COPY_SPLIT = 8
# ESTIMATE_KEYS: a free drafter's estimate is keyed by its name and proposal kind only, not by
# agreement with the other lookups (that splits it into slowly learned parts), and c follows the
# match length, not the draft position, so a new copy is drafted far as soon as its match grows
# (docs/design.md section 7; docs/bench/drafters-full-E/, docs/bench/code-edit-long/).
# RECORD_KINDS: the record is one per policy, so a server's requests teach the next ones; but
# whether a short match goes on depends on the text: in code, a signature or a call copied from
# the prompt goes on; in prose, a phrase said again goes on with other words. So matches shorter
# than KIND_BELOW are recorded apart for two kinds of prompt (prompt_kind): lines (code, files,
# data: at least KIND_MIN_LINES lines, and half the prompt's tokens in lines under KIND_LINE
# tokens) and prose; longer copies, which hold in both, share one record. After eight HumanEval
# answers, Spec-Bench's math question 442 drafted 113 tokens and kept 9 (live, 0.65x) where a
# fresh server drafted none (docs/bench/policy-unseen/carry-over/README.md).
KIND_BELOW, KIND_LINE, KIND_MIN_LINES, KIND_TAIL = 16, 32, 10, 4096


def expected_tokens(rates: Iterable[float]) -> list[float]:
    """[E(0), E(1), ..., E(k)] for conditional acceptances c_1..c_k of a draft's tokens: E(j) =
    1 + sum over i <= j of c_1 ... c_i (the target's own token always counts).
    Example: [0.5, 0.5] -> [1.0, 1.5, 1.75]."""
    out, survive, total = [1.0], 1.0, 1.0
    for c in rates:
        survive *= c
        total += survive
        out.append(total)
    return out


def prompt_kind(prompt: Sequence[int], line_ends: frozenset[int]) -> str:
    """'lines' or 'prose' (RECORD_KINDS): whether half the prompt's tokens lie in lines shorter
    than KIND_LINE tokens, in a prompt of KIND_MIN_LINES lines or more (its last KIND_TAIL tokens
    read). Example: 40 lines of 9 tokens -> 'lines'; a question of 60 tokens in a chat template's
    5 lines -> 'prose'."""
    lengths, length = [], 0
    for token in prompt[-KIND_TAIL:]:
        length += 1
        if token in line_ends:
            lengths.append(length)
            length = 0
    if len(lengths) < KIND_MIN_LINES:
        return "prose"
    short = sum(n for n in lengths if n < KIND_LINE)
    return "lines" if 2 * short >= sum(lengths) + length else "prose"


def copy_bucket(match_length: float) -> int:
    """Index of the bucket for a match length. Example: 6 -> 4 (the 5..7 bucket)."""
    return max(0, bisect.bisect_right(COPY_BUCKETS, match_length) - 1)


@dataclass
class AcceptanceEstimate:
    """Smoothed c_i = P(draft token i accepted | tokens before it accepted), per position.

    Only positions the verifier actually judged are observed: after the first rejection
    later positions say nothing. Old observations decay so the estimate follows the text.
    The prior is one rate for every position, or one per position (the last one repeated): a
    draft of another vocabulary is accepted less at its later positions (drafters/crossvocab.py).
    """

    prior: float | tuple[float, ...]
    prior_weight: float = 3.0
    decay: float = 0.9
    hits: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)

    def prior_at(self, i: int) -> float:
        prior = self.prior
        return prior if isinstance(prior, float | int) else prior[min(i, len(prior) - 1)]

    def rate(self, i: int) -> float:
        """c_i: position i's observations shrunk toward the position before it (scaled as their
        priors are), position 0's toward the prior. A position drafted a few times is then not
        pulled back to the prior (a draft accepted 96% of the time at positions 0-1 and once at
        2 would price 2 at 0.78), and one never drafted borrows the last observed rate, or k
        could never grow past the positions it has already tried."""
        return self.rates(i + 1)[i]

    def rates(self, k: int) -> list[float]:
        """[c_0, ..., c_{k-1}], each shrunk as rate() says."""
        w, out = self.prior_weight, []
        for j in range(k):
            base = self.prior_at(0)
            if j:
                base = min(1.0, out[-1] * self.prior_at(j) / max(1e-9, self.prior_at(j - 1)))
            if j < len(self.trials):
                out.append((self.hits[j] + base * w) / (self.trials[j] + w))
            else:
                out.append(base)
        return out

    def update(self, num_drafted: int, num_accepted: int) -> None:
        for i in range(min(num_drafted, num_accepted + 1)):
            while len(self.trials) <= i:
                self.trials.append(0.0)
                self.hits.append(0.0)
            self.trials[i] = self.trials[i] * self.decay + 1.0
            self.hits[i] = self.hits[i] * self.decay + float(i < num_accepted)

    def expected_tokens(self, k: int) -> list[float]:
        """[E(0), E(1), ..., E(k)]: expected committed tokens when drafting j tokens."""
        return expected_tokens(self.rates(k))

    def summary(self, n: int = 8) -> list[float]:
        return [round(r, 3) for r in self.rates(n)]


class CopyEstimate:
    """c(L) = P(a lookup's token is right | the L tokens before it matched its source), smoothed
    per bucket of L (COPY_BUCKETS). A proposal with backward match length L drafts its token j
    at length L + j, so one accepted 40-token draft teaches c at L..L+40, and a new copy (short
    match) is drafted further as soon as its match grows. A proposal's first token has a table of
    its own: a fresh match is wrong where the text diverges from its source right after a
    repeated part (a JSON key and its value), while a continuation has already survived; and
    continuations of short and long matches have one each (COPY_SPLIT). Each of the three is kept
    twice, for tokens that start a line and for the rest: an edit changes, inserts or moves whole
    lines, so a copy breaks at a line start several times as often as inside a line (LINE_TABLES).
    Each update first decays the buckets it touches once, so the estimate follows the text by
    steps, not tokens. Its buckets of matches shorter than KIND_BELOW are kept per kind of
    prompt, the request's set by begin_request() (RECORD_KINDS above).

    Example: after many fully accepted drafts at L >= 32, c(40) is near 1 and E(31) is near 32,
    while c(3) keeps its prior until short matches are tried.
    """

    def __init__(self, priors: Sequence[float] | None = None, prior_weight: float = 3.0, decay: float = 0.9) -> None:
        # Six tables of COPY_BUCKETS each: first tokens, continuations of short, of long matches;
        # then the same three for tokens that start a line.
        self.priors = tuple(COPY_PRIORS if priors is None else priors) * 6
        self.prior_weight, self.decay = prior_weight, decay
        self.hits = [0.0] * len(self.priors)
        self.trials = [0.0] * len(self.priors)
        self._rates: list[float] | None = None
        self.kind = ""
        num_short = bisect.bisect_left(COPY_BUCKETS, KIND_BELOW)  # buckets of each table kept per kind
        self._short = [i for i in range(len(self.priors)) if i % len(COPY_BUCKETS) < num_short]
        self._kinds: dict[str, tuple[list[float], list[float]]] = {}  # other kinds' short buckets

    def begin_request(self, kind: str) -> None:
        """A request of this kind: its short matches rated by that kind's record (RECORD_KINDS)."""
        if kind == self.kind:
            return
        short = self._short
        if self.kind:
            self._kinds[self.kind] = ([self.hits[i] for i in short], [self.trials[i] for i in short])
        hits, trials = self._kinds.pop(kind, ([0.0] * len(short), [0.0] * len(short)))
        for i, h, t in zip(short, hits, trials):
            self.hits[i], self.trials[i] = h, t
        self.kind, self._rates = kind, None

    def _index(self, length: float, j: int, line_start: bool = False) -> int:
        nb = len(self.priors) // 6
        table = 0 if not j else 1 if length < COPY_SPLIT else 2
        return copy_bucket(length + j) + nb * (table + 3 * line_start)

    def rates(self) -> list[float]:
        """c per bucket of every table: its observations shrunk towards its own prior (each bucket
        on its own: a prior tied to the next shorter bucket's rate replays slower, docs/design.md
        section 7)."""
        if self._rates is None:
            w = self.prior_weight
            self._rates = [(h + p * w) / (t + w) for h, t, p in zip(self.hits, self.trials, self.priors)]
        return self._rates

    def rate(self, length: float, j: int = 0, line_start: bool = False) -> float:
        """c for draft token j of a proposal with backward match length `length`."""
        return self.rates()[self._index(length, j, line_start)]

    def update(self, length: float, num_drafted: int, num_accepted: int, line_starts: Sequence[bool] = ()) -> None:
        """A proposal's first num_accepted tokens were right, and the next (if drafted) wrong;
        line_starts[j]: whether its token j starts a line (none, where it is shorter)."""
        judged = [
            self._index(length, j, j < len(line_starts) and line_starts[j])
            for j in range(min(num_drafted, num_accepted + 1))
        ]
        for i in set(judged):
            self.trials[i] *= self.decay
            self.hits[i] *= self.decay
        for j, i in enumerate(judged):
            self.trials[i] += 1.0
            self.hits[i] += float(j < num_accepted)
        self._rates = None

    def expected_tokens(self, length: float, k: int, line_starts: Sequence[bool] = ()) -> list[float]:
        """[E(0), ..., E(k)] for a proposal whose backward match length is `length`."""
        rates = self.rates()
        n = len(line_starts)
        return expected_tokens(rates[self._index(length, j, j < n and line_starts[j])] for j in range(k))

    def summary(self) -> dict[str, list[float]]:
        """c by bucket of L for first tokens and for continuations of short and of long matches,
        inside a line and at line starts."""
        nb = len(COPY_BUCKETS)
        rate = [round(r, 3) for r in self.rates()]
        names = ("first", "continued_short", "continued_long")
        out = {name: rate[i * nb : (i + 1) * nb] for i, name in enumerate(names)}
        out |= {f"{name}_line_start": rate[(i + 3) * nb : (i + 4) * nb] for i, name in enumerate(names)}
        return out
