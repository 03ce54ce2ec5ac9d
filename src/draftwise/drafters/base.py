"""The Drafter seam: `propose(context, max_tokens) -> Draft` and `accept(n)` feedback.

`begin(sampling, speculation)` starts a request; drafters keep whatever state they
need (a KV cache, an index) in step with the committed context they are shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from draftwise.types import Draft, SamplingParams, SpeculationConfig

if TYPE_CHECKING:
    from draftwise.constraints import Grammar


@runtime_checkable
class Drafter(Protocol):
    name: str
    #: True when proposing costs (next to) nothing compared with a target forward.
    free: bool

    def begin(self, sampling: SamplingParams, speculation: SpeculationConfig) -> None: ...

    def propose(self, context: Sequence[int], max_tokens: int, grammar: Grammar | None = None) -> Draft:
        """Propose up to max_tokens continuation ids of context; Draft(()) if none.

        grammar: the request's constraint at the committed context, or None. A drafter that
        samples (a draft model) drafts under it, so its draft_probs are what it sampled from;
        lookups may ignore it: the engine cuts a deterministic draft at its first token
        outside the grammar, which the target would reject with certainty anyway."""
        ...

    def accept(self, num_accepted: int) -> None:
        """Feedback: how many tokens of the last proposal the target accepted."""
        ...
