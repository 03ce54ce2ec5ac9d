"""The Backend and Tokenizer seams: one implementation per inference library.

A Backend owns one model and one KV cache of a single sequence. `extend` appends
tokens and returns logits for every new position; `truncate` drops cached positions
and raises if it cannot. The draft model is a Backend too.

A backend loaded with several slots also serves `sequence(i)`: a Backend of its own for
sequence i over the same model and cache memory (sequence 0 is the backend itself), and
`extend_batch`, one forward over several sequences (continuous batching). What a backend
can do beyond one sequence (slots, batching, token trees, prefix sharing, interruption) it
declares in `capabilities`; callers read that and never probe for methods.

`encode_chat` tokenises a chat prompt so that message text stays text: control tokens
come only from the chat template.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from draftwise.errors import BackendError as BackendError  # re-exported: raised by every backend
from draftwise.errors import ContextOverflowError as ContextOverflowError
from draftwise.errors import ForwardInterrupted as ForwardInterrupted
from draftwise.types import ConfigError


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, as it declares it: the engine, the step and the batcher read this
    and call the matching methods, never probing for them.

    Example: a llama.cpp target loaded with 4 slots declares num_slots=4, batching=True,
    prefix_sharing=True, interruption=True, max_branches=1 (trees and slots do not combine).
    """

    exact: bool = False  # batched logits equal one-at-a-time logits bit for bit
    device: str = "cpu"
    dtype: str = "float32"
    # Token-tree branches one forward verifies (extend_tree, commit_branch); 1: chains only.
    max_branches: int = 1
    num_slots: int = 1  # sequences served by sequence(i) over one model (Sequences)
    batching: bool = False  # extend_batch runs several of its sequences in one forward
    prefix_sharing: bool = False  # share_prefix(source, n) takes another sequence's cached prefix
    interruption: bool = False  # interruptible(check) stops a forward part-way (a long prompt read)


@runtime_checkable
class Tokenizer(Protocol):
    eos_token_ids: frozenset[int]

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """add_special: the model's BOS (and the like); parse_special: a control token's text
        ("<|im_start|>") becomes that token, else it is tokenised as the plain text it is."""
        ...

    @property
    def control_texts(self) -> frozenset[str]:
        """The texts encode() reads as control tokens when parse_special is on."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...
    def token_text(self, token_id: int) -> str: ...
    def fim_token_ids(self) -> dict[str, int] | None:
        """The vocabulary's fill-in-the-middle tokens by role (draftwise.fim), or None where the
        tokenizer does not know them (draftwise.fim then finds them by their texts)."""
        ...

    def apply_chat_template(
        self, messages: Sequence[dict], *, add_generation_prompt: bool = True, tools: Sequence[dict] | None = None
    ) -> str:
        """The prompt text; tools (OpenAI's function tools) are rendered as the template does."""
        ...

    @property
    def chat_template(self) -> str | None:
        """The chat template's source (None: the model has none); tells the tool-call format."""
        ...

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
    #: The CPU threads its forwards run on (0: not a setting of this backend, e.g. on a GPU);
    #: a cost curve is timed, and cached, per thread count.
    n_threads: int

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

    def interruptible(self, check: Callable[[], bool]) -> AbstractContextManager[None]:
        """A context in which forwards stop part-way once check() is true (raising
        ForwardInterrupted, the caches as before the forward); a backend that cannot stop a
        forward part-way returns a context that changes nothing."""
        ...

    def kv_bytes(self) -> dict[str, int]:
        """The KV cache's memory, from the model's own shape (no walk over tensors): `per_token`,
        the bytes one cached position takes over every layer, keys and values; `allocated`, what
        the cache reserves (llama.cpp reserves every cell of its context up front, n_ctx x slots;
        transformers grows with the tokens held); `used`, the positions it holds now. A backend
        loaded with slots reports its whole cache (every sequence); sequence(i), its own.

        Example: Qwen2.5-Coder 1.5B in llama.cpp (28 layers, 2 KV heads of 128, f16 cache):
        per_token = 28 x (256 + 256) x 2 = 28672; n_ctx 4096 -> allocated 112 MiB; 1000 tokens
        cached -> used 28 MiB."""
        ...

    def weight_bytes(self) -> int:
        """The model's weights as its library holds them, in bytes: llama.cpp the GGUF's tensors
        (llama_model_size), transformers its parameters and buffers at their dtype."""
        ...


def kv_figures(per_token: int, allocated_tokens: int, used_tokens: int) -> dict[str, int]:
    """kv_bytes()'s dict: per_token and the two counts of positions in bytes."""
    return {"per_token": per_token, "allocated": per_token * allocated_tokens, "used": per_token * used_tokens}


class Sequences(Protocol):
    """What a backend declaring num_slots > 1 (or batching) adds: llama.cpp, transformers and
    toy backends loaded with slots."""

    @property
    def num_slots(self) -> int: ...

    def sequence(self, slot: int) -> Backend:
        """The Backend of sequence `slot` (0 <= slot < num_slots; 0 is this backend)."""
        ...

    def extend_batch(self, items: Sequence[tuple[Backend, Sequence[int], int]]) -> list[np.ndarray]:
        """One forward over several sequences: items (sequence, ids, num_logits), each as
        sequence.extend(ids, num_logits) would do it; logits [num_logits, V] per item."""
        ...


class Trees(Protocol):
    """What a backend declaring max_branches > 1 adds: one forward over a token tree."""

    def extend_tree(self, last: int, branches: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Logits [1 + len(b), V] for each branch after [last]; the cache is settled by
        commit_branch (at most capabilities.max_branches branches)."""
        ...

    def commit_branch(self, branch: int, num_accepted: int) -> None:
        """Keep [last] + branches[branch][:num_accepted] in the cache; drop the other branches."""
        ...


class PrefixSharing(Protocol):
    """What a sequence declaring prefix_sharing adds (llama.cpp: one unified KV cache)."""

    def share_prefix(self, source: Backend, n: int) -> bool:
        """Make this sequence's cache the first n cached positions of source, another sequence
        of the same model; False, changing nothing, where it cannot."""
        ...


def num_slots(backend: Backend) -> int:
    """How many sequences the backend can decode together (1 for a single-sequence backend)."""
    return backend.capabilities.num_slots


def extend_batch(backend: Backend, items: Sequence[tuple[Backend, Sequence[int], int]]) -> list[np.ndarray]:
    """One forward over several sequences of backend where it batches them, else one per item."""
    if backend.capabilities.batching and len(items) > 1:
        return backend.extend_batch(items)
    return [seq.extend(ids, n) if n else _prefill(seq, ids) for seq, ids, n in items]


def interruptible(backend: Backend, check: Callable[[], bool]):
    """A context in which backend's forwards stop part-way once check() is true (raising
    ForwardInterrupted, the caches as before the forward); where the backend cannot stop a
    forward part-way, nothing changes and forwards run to their end."""
    return backend.interruptible(check)


def _prefill(seq: Backend, ids: Sequence[int]) -> np.ndarray:
    seq.prefill(ids)
    return np.zeros((0, seq.vocab_size), dtype=np.float32)


def utf8(text: str) -> bytes:
    """text as UTF-8; a lone surrogate (not valid Unicode) is a ConfigError naming it, not the text."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"the text holds U+{ord(exc.object[exc.start]):04X} at index {exc.start}, a lone "
            "surrogate, which is not valid Unicode"
        ) from None


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


# ---------------------------------------------------------------------- chat prompts
# Private markers around a control token's text found in a message (Unicode noncharacters,
# "not for interchange": removed from messages first, so no client can write one).
_MARK_START, _MARK_END = "\ufdd0", "\ufdd1"
_STRUCTURAL_KEYS = frozenset({"role", "type"})  # values from a fixed set that templates compare against


def encode_chat(
    tokenizer: Tokenizer,
    messages: Sequence[dict],
    *,
    add_generation_prompt: bool = True,
    tools: Sequence[dict] | None = None,
) -> list[int]:
    """The chat prompt's token ids, with every string the messages carry (content, names, tool
    text) tokenised as plain text: control tokens come only from the chat template itself.

    Example (Qwen): a user message "hi<|im_end|>" encodes as [151644] + text("user\nhi") +
    text("<|im_end|>") + [151645] + ...: the message's "<|im_end|>" as the text tokens that
    spell it, never 151645.

    A message without a control token's text (almost all) is rendered and tokenised whole, as
    ever. Otherwise each such text in the messages is wrapped in private markers before the
    template renders them, so it stays recognisable whatever the template does around it (trim,
    split); the rendering is then tokenised with control tokens parsed, but the marked texts as
    plain text. A lone marker (a template that split a marked text) is dropped but still breaks
    the text, so the two sides cannot join into a control token.
    """
    controls = _control_pattern(tokenizer.control_texts)
    forged = controls is not None and any(controls.search(s) for s in _strings([messages, tools or []]))
    extra = {"tools": list(tools)} if tools else {}
    if not forged:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **extra)
        utf8(text)  # text that is not valid Unicode is refused by name
        return tokenizer.encode(text, add_special=True)
    if tools:
        extra = {"tools": _marked(list(tools), controls)}
    marked = tokenizer.apply_chat_template(
        _marked(messages, controls), add_generation_prompt=add_generation_prompt, **extra
    )
    utf8(marked)
    # [text, marked control text, text, ..., text]; a lone marker leaves None in the odd place
    parts = re.split(f"{_MARK_START}({controls.pattern}){_MARK_END}|[{_MARK_START}{_MARK_END}]", marked)
    ids = tokenizer.encode(parts[0], add_special=True)
    newline = tokenizer.encode("\n", add_special=False, parse_special=False)
    for i, part in enumerate(parts[1:], start=1):
        if part:
            ids += _encode_inside(tokenizer, part, parse_special=i % 2 == 0, newline=newline)
    return ids


@functools.lru_cache(maxsize=8)
def _control_pattern(texts: frozenset[str]) -> re.Pattern | None:
    """One regex that finds any of texts (longest first, so a token wins over those it holds)."""
    texts = [t for t in texts if t]
    if not texts:
        return None
    return re.compile("(?:" + "|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)) + ")")


def _strings(value: Any, key: str | None = None) -> Iterator[str]:
    """The free-text strings in messages (content, names, tool text), at any depth."""
    if isinstance(value, str):
        if key not in _STRUCTURAL_KEYS:
            yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, k)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _marked(value: Any, controls: re.Pattern, key: str | None = None) -> Any:
    """value with every control text in its free-text strings wrapped in the private markers."""
    if isinstance(value, str):
        if key in _STRUCTURAL_KEYS:
            return value
        value = value.replace(_MARK_START, "").replace(_MARK_END, "")
        return controls.sub(lambda m: f"{_MARK_START}{m.group()}{_MARK_END}", value)
    if isinstance(value, dict):
        return {k: _marked(v, controls, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_marked(v, controls) for v in value]
    return value


def _encode_inside(tokenizer: Tokenizer, text: str, *, parse_special: bool, newline: list[int]) -> list[int]:
    """text's ids as they read in the middle of a prompt.

    NOTE: tokenised after a newline that is then dropped, because SentencePiece vocabularies
    prepend a space to the start of a text (and transformers does it the same way); where the
    newline merges with the text, the text is tokenised alone.
    """
    ids = tokenizer.encode("\n" + text, add_special=False, parse_special=parse_special)
    if newline and ids[: len(newline)] == newline:
        return ids[len(newline) :]
    return tokenizer.encode(text, add_special=False, parse_special=parse_special)


_MARKS: dict[int, tuple[object, TextMarks]] = {}


@dataclass(frozen=True)
class TextMarks:
    """Token ids by what their text holds: `line_ends` end with a newline, `fences` hold two
    backticks or more (a Markdown code fence, or the part of one that a tokenizer splits off:
    "```\n\n" can be "``" + "`\n\n")."""

    line_ends: frozenset[int]
    fences: frozenset[int]


def text_marks(tokenizer: Tokenizer, vocab_size: int) -> TextMarks:
    """The vocabulary's TextMarks, computed once per tokenizer (~0.4 s for a 150k vocabulary).
    The auto policy rates a lookup's token that starts a line apart, and ends a lookup's
    proposal before a fence."""
    cached = _MARKS.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    texts = [tokenizer.decode([i]) for i in range(vocab_size)]
    marks = TextMarks(
        frozenset(i for i, t in enumerate(texts) if t.endswith("\n")),
        frozenset(i for i, t in enumerate(texts) if "``" in t),
    )
    _MARKS[id(tokenizer)] = (tokenizer, marks)
    return marks
