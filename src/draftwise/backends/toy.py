"""Toy backend: exact float64 probability tables, for tests and examples.

A ToyModel maps the last `order` tokens to a fixed logit vector drawn from a seeded
generator, so distributions are known exactly and batched == one-at-a-time by
construction. A character tokenizer gives it text: token 0 is EOS, 1.. are characters (a piece
tokenizer, pieces of several characters: a toy of another vocabulary).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import numpy as np

from draftwise.backends.base import BackendError, Capabilities, ContextOverflowError, kv_figures

# The toy's "cache" is its list of ids: one list slot (a pointer) per position.
KV_TOKEN_BYTES = 8
DEFAULT_ALPHABET = "abcdefghijklmnopqrstuvwxyz .,!?\n0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ()[]{}:;=+-*/_'\"<>#"


class CharTokenizer:
    """Token 0 is EOS ("</s>"); token i >= 1 is alphabet[i - 1]. Unknown chars are dropped."""

    def __init__(self, vocab_size: int, alphabet: str = DEFAULT_ALPHABET) -> None:
        if vocab_size < 2:
            raise ValueError(f"toy vocab_size must be >= 2, got {vocab_size}")
        pieces = list(alphabet[: vocab_size - 1])
        while len(pieces) < vocab_size - 1:  # larger vocabularies get synthetic pieces
            pieces.append(f"<{len(pieces) + 1}>")
        self._pieces = ["</s>", *pieces]
        self._index = {p: i for i, p in enumerate(self._pieces) if len(p) == 1}
        self.eos_token_ids = frozenset({0})

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    control_texts: frozenset[str] = frozenset()  # "</s>" and "<17>" are never read from text

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [self._index[c] for c in text if c in self._index]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self._pieces[i] for i in ids if i != 0)

    def token_text(self, token_id: int) -> str:
        return self._pieces[token_id]

    def fim_token_ids(self) -> dict[str, int] | None:
        return None  # single characters: no FIM tokens

    chat_template: str | None = None  # the toy's format below has no tools

    def apply_chat_template(
        self, messages: Sequence[dict], *, add_generation_prompt: bool = True, tools: Sequence[dict] | None = None
    ) -> str:
        text = "".join(f"{m['role'][0]}:{m['content']}\n" for m in messages)
        return text + ("a:" if add_generation_prompt else "")

    def llguidance_tokenizer(self, n_vocab: int):
        """Each piece's UTF-8 bytes; EOS and the synthetic pieces are special tokens."""
        from draftwise.constraints import lltokenizer_from_pieces

        return lltokenizer_from_pieces(
            [p.encode() for p in self._pieces],
            eos_token_id=0,
            n_vocab=n_vocab,
            special_token_ids=[i for i, p in enumerate(self._pieces) if len(p) != 1],
            encode=lambda text: self.encode(text.decode("utf-8", errors="ignore")),
        )


class PieceTokenizer(CharTokenizer):
    """Token 0 is EOS; token i >= 1 is pieces[i - 1], one or more characters; encode takes the
    longest piece at each position (unknown characters dropped). Two of these whose pieces
    partly agree are toy models of two vocabularies (drafters/crossvocab.py).

    Example: pieces ["a", "b", "ab", "x"] encodes "abxb" as [3, 4, 2]; decode gives "abxb".
    """

    def __init__(self, pieces: Sequence[str]) -> None:
        if not pieces or any(not p for p in pieces) or len(set(pieces)) != len(pieces):
            raise ValueError("pieces must be distinct non-empty strings")
        self._pieces = ["</s>", *pieces]
        self._index = {p: i for i, p in enumerate(self._pieces) if i > 0}
        self._longest = max(len(p) for p in pieces)
        self.eos_token_ids = frozenset({0})

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        ids, pos = [], 0
        while pos < len(text):
            for size in range(min(self._longest, len(text) - pos), 0, -1):
                token = self._index.get(text[pos : pos + size])
                if token is not None:
                    ids.append(token)
                    pos += size
                    break
            else:
                pos += 1
        return ids

    def llguidance_tokenizer(self, n_vocab: int):
        from draftwise.constraints import lltokenizer_from_pieces

        return lltokenizer_from_pieces(
            [p.encode() for p in self._pieces],
            eos_token_id=0,
            n_vocab=n_vocab,
            special_token_ids=[0],
            encode=lambda text: self.encode(text.decode("utf-8", errors="ignore")),
        )


@dataclass
class ToyModel:
    """Logits depend on the last `order` tokens only: exact and cheap.

    sharpness scales the logits: high values give peaked distributions (easy to
    draft), low values flat ones. Two models with the same seed are identical.
    """

    vocab_size: int = 16
    order: int = 2
    seed: int = 0
    sharpness: float = 2.0
    eos_bias: float = -4.0  # keeps EOS rare so sequences run long
    _table: dict = field(default_factory=dict, repr=False)

    def logits(self, context: Sequence[int]) -> np.ndarray:
        key = tuple(context[-self.order :]) if self.order > 0 else ()
        row = self._table.get(key)
        if row is None:
            digest = hashlib.sha256(repr((self.seed, key)).encode()).digest()
            rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
            row = rng.standard_normal(self.vocab_size) * self.sharpness
            row[0] += self.eos_bias
            self._table[key] = row
        return row


class ToyBackend:
    """A Backend over a logits function of the full context; float64, exact."""

    def __init__(
        self,
        model: ToyModel | None = None,
        *,
        logits_fn: Callable[[Sequence[int]], np.ndarray] | None = None,
        vocab_size: int | None = None,
        n_ctx: int = 4096,
        name: str = "toy",
        tokenizer: CharTokenizer | None = None,  # or a PieceTokenizer
        slots: int = 1,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        if logits_fn is None:
            model = model or ToyModel()
            logits_fn = model.logits
            vocab_size = model.vocab_size
        if vocab_size is None:
            raise ValueError("vocab_size is required with a custom logits_fn")
        self._logits_fn = logits_fn
        self._vocab_size = vocab_size
        self._n_ctx = n_ctx
        self._ids: list[int] = []
        self.name = name
        self.identity = f"toy:{name}:{model!r}" if model is not None else f"toy:{name}:{id(logits_fn)}"
        self.tokenizer = tokenizer or CharTokenizer(vocab_size)
        self.n_threads = 0  # numpy's own, not a setting of this backend
        # Trees: no limit of its own, 16 bounds one. Its sequences are toy backends of one slot.
        self.capabilities = Capabilities(exact=True, dtype="float64", max_branches=16, num_slots=slots, batching=True)
        self.num_forwards = 0  # target forwards, for tests
        self.num_batches = 0  # extend_batch calls (one forward over several sequences)
        self._slots: list[ToyBackend] = [self]
        for i in range(1, slots):
            seq = ToyBackend(
                logits_fn=logits_fn, vocab_size=vocab_size, n_ctx=n_ctx, name=f"{name}#{i}", tokenizer=self.tokenizer
            )
            seq.identity = self.identity
            self._slots.append(seq)

    # ---------------------------------------------------------------- sequences
    @property
    def num_slots(self) -> int:
        return self.capabilities.num_slots

    def sequence(self, slot: int) -> ToyBackend:
        return self._slots[slot]

    def extend_batch(self, items: Sequence[tuple[ToyBackend, Sequence[int], int]]) -> list[np.ndarray]:
        for seq, _, _ in items:
            if not any(seq is s for s in self._slots):
                raise BackendError(f"{seq.name} is not a sequence of {self.name}")
        self.num_batches += 1
        return [seq.extend(ids, n) for seq, ids, n in items]

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def num_cached(self) -> int:
        return len(self._ids)

    @property
    def cached_ids(self) -> list[int]:
        return list(self._ids)

    def kv_bytes(self) -> dict[str, int]:
        """The ids it holds, KV_TOKEN_BYTES each (every sequence's for the backend itself)."""
        held = sum(len(seq._ids) for seq in self._slots)
        return kv_figures(KV_TOKEN_BYTES, held, held)

    def weight_bytes(self) -> int:
        return 0  # logits come from a function, not weights

    def _append(self, ids: Sequence[int]) -> None:
        if len(self._ids) + len(ids) > self._n_ctx:
            raise ContextOverflowError(f"{len(self._ids) + len(ids)} tokens exceed the context of {self._n_ctx}")
        for t in ids:
            if not 0 <= int(t) < self._vocab_size:
                raise BackendError(f"token id {t} outside the vocabulary of {self._vocab_size}")

    def extend(self, ids: Sequence[int], num_logits: int | None = None) -> np.ndarray:
        self._append(ids)
        self.num_forwards += 1
        first_read = 0 if num_logits is None else len(ids) - num_logits
        rows = []
        for i, t in enumerate(ids):
            self._ids.append(int(t))
            if i >= first_read:
                rows.append(np.asarray(self._logits_fn(self._ids), dtype=np.float64))
        return np.stack(rows) if rows else np.zeros((0, self._vocab_size))

    def extend_tree(self, last: int, branches: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Logits [1 + len(b), V] for each branch after [last]; the cache is unchanged
        until commit_branch picks one (one target pass in a real backend)."""
        self._append([last])
        self.num_forwards += 1
        out = []
        for branch in branches:
            self._append([last, *branch])
            context = [*self._ids, int(last)]
            rows = [np.asarray(self._logits_fn(context), dtype=np.float64)]
            for t in branch:
                context.append(int(t))
                rows.append(np.asarray(self._logits_fn(context), dtype=np.float64))
            out.append(np.stack(rows))
        self._pending_tree = (int(last), [list(b) for b in branches])
        return out

    def commit_branch(self, branch: int, num_accepted: int) -> None:
        """Keep [last] + branches[branch][:num_accepted] in the cache."""
        last, branches = self._pending_tree
        self._ids.extend([last, *branches[branch][:num_accepted]])
        self._pending_tree = None

    def prefill(self, ids: Sequence[int]) -> None:
        self._append(ids)
        self._ids.extend(int(t) for t in ids)

    def truncate(self, n_keep: int) -> None:
        if not 0 <= n_keep <= len(self._ids):
            raise BackendError(f"cannot truncate {len(self._ids)} cached positions to {n_keep}")
        del self._ids[n_keep:]

    def reset(self) -> None:
        self._ids.clear()

    def interruptible(self, check: Callable[[], bool]) -> AbstractContextManager[None]:
        return nullcontext()  # a toy forward is over before any check could stop it

    def close(self) -> None:
        self.reset()
