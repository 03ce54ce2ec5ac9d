"""The Drafter seam: `propose(context, max_tokens) -> Draft` and `accept(n)` feedback.

`begin(sampling, speculation, prompt, tokenizer)` starts a request; drafters keep whatever
state they need (a KV cache, an index) in step with the committed context they are shown, and
`memory_bytes()` says how much that state holds. BaseDrafter gives the optional parts (parallel
slots, a history kept across requests, no state) defaults.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from draftwise.types import ConfigError, Draft, SamplingParams, SpeculationConfig, TreeDraft

if TYPE_CHECKING:
    from draftwise.backends.base import Backend, Tokenizer
    from draftwise.constraints import Grammar

# What the Python objects of a lookup index take on this interpreter (sys.getsizeof): a drafter's
# memory_bytes() multiplies the counts of its entries by these instead of walking its index
# (tests/unit/test_drafter_memory.py checks the estimates against tracemalloc).
POINTER = struct.calcsize("P")
LIST_SLOT = POINTER * 9 // 8  # a list grown by appends over-allocates by about an eighth
INT = sys.getsizeof(2**20)  # a position (or token id) past CPython's cache of small ints
NEW_LIST = sys.getsizeof([0, 0, 0, 0])  # a list's header and its first allocation (4 slots)
DICT_ENTRY = 48  # a dict's entry and index, amortised over its doublings (30-52 measured)


def tuple_bytes(n: int) -> int:
    """A tuple of n items (an n-gram key)."""
    return sys.getsizeof(tuple(range(n)))


@runtime_checkable
class Drafter(Protocol):
    name: str
    #: True when proposing costs (next to) nothing compared with a target forward.
    free: bool
    #: A draft model's backend (its tokenizer is checked against the target's); None: no model.
    backend: Backend | None
    #: True for a draft model of another vocabulary that maps its proposals to target ids
    #: (drafters/crossvocab.py): its backend's tokenizer is not checked against the target's.
    own_vocabulary: bool
    #: Cached draft positions reused from the previous request at this request's first proposal.
    num_reused_tokens: int
    #: Drafting stops where the next token's confidence falls below this (0: never); the auto
    #: policy sets a draft model's from measured costs.
    min_confidence: float
    #: The acceptance per draft token the auto policy starts from, one rate or one per position;
    #: None: the policy's own (policy.auto.DRAFT_MODEL_PRIOR).
    acceptance_prior: float | tuple[float, ...] | None

    def begin(
        self,
        sampling: SamplingParams,
        speculation: SpeculationConfig,
        prompt: Sequence[int] = (),
        tokenizer: Tokenizer | None = None,
    ) -> None:
        """Start a request: its prompt ids (penalties count the output only) and the target's
        tokenizer (for a drafter that reads text)."""
        ...

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

    def propose_tree(self, context: Sequence[int], max_tokens: int, max_branches: int) -> TreeDraft | None:
        """Up to max_branches continuations of context (a token tree); None: chains only."""
        ...

    def catch_up(self, context: Sequence[int]) -> int:
        """Tokens this drafter must feed before its first draft token after context (a draft
        model: what its cache lacks); the auto policy prices them. At least 1."""
        ...

    def for_slot(self, slot: int) -> Drafter:
        """A drafter of the same kind for the target's parallel slot `slot`, with its own state;
        raises ConfigError if it cannot serve parallel slots."""
        ...

    def snapshot(self) -> Any:
        """The state that outlives a request (a history of past answers), for restore()."""
        ...

    def restore(self, state: Any) -> None:
        """Go back to a snapshot(): benchmarks start every method from the same state."""
        ...

    def memory_bytes(self) -> int:
        """The memory this drafter's own state holds now, in bytes (an index, a history; a draft
        model: its KV cache's used bytes, its weights counted apart). Cheap enough to call once a
        request: counts of entries times their size, never a walk over the index. Each drafter's
        docstring states its bound."""
        ...


class BaseDrafter:
    """Defaults for the optional parts of the Drafter seam: no model, nothing reused, no
    parallel slots, no token trees, no prior of its own, one token to catch up, and no state
    across requests."""

    backend: Backend | None = None
    own_vocabulary: bool = False
    num_reused_tokens: int = 0
    min_confidence: float = 0.0
    acceptance_prior: float | tuple[float, ...] | None = None

    def begin(
        self,
        sampling: SamplingParams,
        speculation: SpeculationConfig,
        prompt: Sequence[int] = (),
        tokenizer: Tokenizer | None = None,
    ) -> None:
        pass

    def accept(self, num_accepted: int) -> None:
        pass

    def propose_tree(self, context: Sequence[int], max_tokens: int, max_branches: int) -> TreeDraft | None:
        return None

    def catch_up(self, context: Sequence[int]) -> int:
        return 1

    def for_slot(self, slot: int) -> Drafter:
        raise ConfigError(f"drafter {self.name!r} cannot serve parallel slots")  # type: ignore[attr-defined]

    def snapshot(self) -> Any:
        return None

    def restore(self, state: Any) -> None:
        pass

    def memory_bytes(self) -> int:
        return 0


class Follower:
    """When a lookup drafter's index may trust the context it is shown. Within one request the
    context only grows (committed tokens are final), so after the request's first context was
    compared in full, later ones are checked only for length: a step's lookup costs the same at
    28k tokens of context as at 1k. Outside a request (a drafter called without begin(), as
    tests and tools do), every context is compared in full."""

    def __init__(self) -> None:
        self.in_request = False
        self.checked = False

    def begin(self) -> None:
        self.in_request, self.checked = True, False

    def trusts(self, context_len: int, known: int) -> bool:
        """Whether context[:known] may be taken as the tokens already indexed."""
        return self.in_request and self.checked and context_len >= known

    def compared(self) -> None:
        """The context was compared in full (and the index brought in line with it)."""
        self.checked = self.in_request
