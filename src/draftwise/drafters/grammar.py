"""Grammar drafter: the bytes a request's constraint forces next, as a free deterministic draft.

Tokens that are the only ones the grammar allows never reach a drafter: the engine commits
them without a target decision. What is left are forced byte strings that other tokenisations
could also spell (a JSON key after a free-text value, say); their canonical tokens, from
llguidance's fast-forward, are proposed here and verified like any lookup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from draftwise.drafters.base import BaseDrafter
from draftwise.types import Draft

if TYPE_CHECKING:
    from draftwise.constraints import Grammar

# Fast-forward tokens are the grammar's own text: the auto policy's estimate starts from the
# prior of its longest-match bucket.
SCORE = 32.0


class GrammarDrafter(BaseDrafter):
    free = True

    def __init__(self, name: str = "grammar") -> None:
        self.name = name

    def for_slot(self, slot: int) -> GrammarDrafter:
        return GrammarDrafter(self.name)

    def propose(self, context: Sequence[int], max_tokens: int, grammar: Grammar | None = None) -> Draft:
        if grammar is None or max_tokens <= 0:
            return Draft((), source=self.name)
        return Draft(tuple(grammar.fast_forward(max_tokens)), source=self.name, score=SCORE)
