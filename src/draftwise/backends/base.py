"""The Backend and Tokenizer seams: one implementation per inference library.

A Backend owns one model and one KV cache of a single sequence. `extend` appends
tokens and returns logits for every new position; `truncate` drops cached positions
and raises if it cannot. The draft model is a Backend too.

A backend loaded with several slots also serves `sequence(i)`: a Backend of its own for
sequence i over the same model and cache memory (sequence 0 is the backend itself), and
`extend_batch`, one forward over several sequences (continuous batching).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from draftwise.errors import BackendError as BackendError  # re-exported: raised by every backend
from draftwise.errors import ContextOverflowError as ContextOverflowError
from draftwise.types import ConfigError


@dataclass(frozen=True)
class Capabilities:
    exact: bool = False  # batched logits equal one-at-a-time logits bit for bit
    device: str = "cpu"
    dtype: str = "float32"


@runtime_checkable
class Tokenizer(Protocol):
    eos_token_ids: frozenset[int]

    def encode(self, text: str, *, add_special: bool = True) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def token_text(self, token_id: int) -> str: ...
    def apply_chat_template(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> str: ...
    def llguidance_tokenizer(self, n_vocab: int):
        """llguidance's LLTokenizer over this vocabulary, n_vocab wide (structured output)."""
        ...

    @property
    def vocab_size(self) -> int: ...


@runtime_checkable
class Backend(Protocol):
    name: str  # human-readable model name, e.g. the file name
    identity: str  # stable id for caches: path + size + mtime, or a config hash
    tokenizer: Tokenizer
    capabilities: Capabilities

    @property
    def vocab_size(self) -> int: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def num_cached(self) -> int: ...
    @property
    def cached_ids(self) -> list[int]: ...

    def extend(self, ids: Sequence[int], num_logits: int | None = None) -> np.ndarray:
        """Append ids to the cache; return logits [num_logits, V] (float32 or float64) for the
        last num_logits positions (None: all of them)."""
        ...

    def prefill(self, ids: Sequence[int]) -> None:
        """Append ids to the cache without returning logits (prompt processing)."""
        ...

    def truncate(self, n_keep: int) -> None:
        """Drop cached positions >= n_keep. Raises BackendError if that fails."""
        ...

    def reset(self) -> None: ...
    def close(self) -> None: ...


class Sequences(Protocol):
    """What a multi-sequence backend adds (llama.cpp and toy backends loaded with slots)."""

    @property
    def num_slots(self) -> int: ...

    def sequence(self, slot: int) -> Backend:
        """The Backend of sequence `slot` (0 <= slot < num_slots; 0 is this backend)."""
        ...

    def extend_batch(self, items: Sequence[tuple[Backend, Sequence[int], int]]) -> list[np.ndarray]:
        """One forward over several sequences: items (sequence, ids, num_logits), each as
        sequence.extend(ids, num_logits) would do it; logits [num_logits, V] per item."""
        ...


def num_slots(backend: Backend) -> int:
    """How many sequences the backend can decode together (1 for a single-sequence backend)."""
    return getattr(backend, "num_slots", 1)


def extend_batch(backend: Backend, items: Sequence[tuple[Backend, Sequence[int], int]]) -> list[np.ndarray]:
    """One forward over several sequences of backend where it batches them, else one per item."""
    batched = getattr(backend, "extend_batch", None)
    if batched is not None and len(items) > 1:
        return batched(items)
    return [seq.extend(ids, n) if n else _prefill(seq, ids) for seq, ids, n in items]


def _prefill(seq: Backend, ids: Sequence[int]) -> np.ndarray:
    seq.prefill(ids)
    return np.zeros((0, seq.vocab_size), dtype=np.float32)


def utf8(text: str) -> bytes:
    """text as UTF-8; a lone surrogate (not valid Unicode) is a ConfigError naming it, not the text."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"the text holds U+{ord(exc.object[exc.start]):04X} at index {exc.start}, a lone "
                          "surrogate, which is not valid Unicode") from None


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the shared prefix. Example: ([1, 2, 3], [1, 2, 4, 5]) -> 2."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    lo, hi = 0, n  # binary search on the first mismatch; list slices compare in C
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if list(a[:mid]) == list(b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def sync_cache(backend: Backend, ids: Sequence[int]) -> int:
    """Make the backend cache hold exactly ids[:len(ids)] reusing the shared prefix.

    Returns the number of reused positions. Used for prompt caching across requests
    and for keeping a draft model's cache in step with committed tokens.
    """
    keep = common_prefix_length(backend.cached_ids, ids)
    if keep < backend.num_cached:
        backend.truncate(keep)
    if keep < len(ids):
        backend.prefill(ids[keep:])
    return keep
