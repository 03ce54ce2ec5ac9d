"""Frequency walk shared by the suffix and datastore drafters.

Given the positions where the context's longest suffix occurs (a suffix-tree node),
propose the continuation token by token, each time taking the most frequent next token
among the occurrences that still agree (after SuffixDecoding, arXiv 2411.04975, and
REST, arXiv 2311.08252). Confidence of a token = agreeing occurrences / all occurrences.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence


def frequency_walk(
    token_at: Callable[[int], int | None],
    positions: Sequence[int],
    max_tokens: int,
    min_confidence: float = 0.0,
) -> tuple[list[int], list[float]]:
    """Walk forward from `positions` (where continuations start).

    token_at(p) returns the token at p, or None past the end of a document.
    Example: tokens "abx abx aby" with positions at the three 'x/y' slots -> proposes
    'x' with confidence 2/3 (one occurrence continues with 'y' and drops out).
    """
    live = list(positions)
    proposal: list[int] = []
    confidences: list[float] = []
    cumulative = 1.0
    for offset in range(max_tokens):
        counts = Counter()
        for p in live:
            t = token_at(p + offset)
            if t is not None:
                counts[t] += 1
        if not counts:
            break
        token, count = counts.most_common(1)[0]
        conf = count / len(live)
        cumulative *= conf
        if proposal and cumulative < min_confidence:
            break
        proposal.append(token)
        confidences.append(conf)
        live = [p for p in live if token_at(p + offset) == token]
    return proposal, confidences
