"""The Drafter seam: `propose(context, max_tokens) -> Draft` and `accept(n)` feedback.

`begin(sampling, speculation)` starts a request; drafters keep whatever state they
need (a KV cache, an index) in step with the committed context they are shown.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from draftwise.types import Draft, SamplingParams, SpeculationConfig


@runtime_checkable
class Drafter(Protocol):
    name: str
    #: True when proposing costs (next to) nothing compared with a target forward.
    free: bool

    def begin(self, sampling: SamplingParams, speculation: SpeculationConfig) -> None: ...

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        """Propose up to max_tokens continuation ids of context; Draft(()) if none."""
        ...

    def accept(self, num_accepted: int) -> None:
        """Feedback: how many tokens of the last proposal the target accepted."""
        ...
