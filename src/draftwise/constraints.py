"""Structured output: compiling a request's Constraint, and the Grammar matcher the engine owns.

A Constraint (types.py: JSON schema, any JSON object, regex, Lark or GBNF grammar) is compiled by
llguidance against the target's vocabulary (the tokenizer adapter is built once per model).
The reference distribution is: mask the target logits with the grammar, then apply the
sampling transforms, then sample; greedy is the argmax of the masked logits. The engine
advances the Grammar along a draft for its k+1 masks and keeps it at the committed tokens.
A lazy constraint (tool calls) is a LazyGrammar: free text until a trigger, a Grammar after it.
"""

from __future__ import annotations

import decimal
import json
import math
import re
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from draftwise.errors import ConstraintError
from draftwise.types import Constraint as Constraint  # re-exported beside compile_constraint

# JSON is written with json.dumps' default separators and no other whitespace: a grammar
# that allows any whitespace lets a model emit spaces and newlines until max_tokens (the
# known failure of flexible-whitespace JSON grammars), and fixed separators are forced
# tokens, which cost no decision. Applied over the schema's own "x-guidance" options.
JSON_OVERRIDES = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# llguidance reads a schema's numeric bounds as 64-bit floats and builds its number patterns from
# them: exact for an integer up to 2**53 in magnitude and for a fraction of at most 15
# significant digits (a float's DBL_DIG), not beyond (an integer minimum of 10**20 became
# 2**63 - 1, which was the answer; a maximum of 2**62 let 2**62 + 1 through, one of
# 972121617984.1307 let 972121617984.1309 through), and some crash it (see embedded_schemas).
# Such a bound is refused, not rounded.
EXACT_INTEGER, EXACT_DIGITS = 2**53, 15
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_DATA = ("const", "enum", "default", "examples")  # values, not schemas: their numbers are matched as text


def schema_fault(schema: Any) -> str | None:
    """Why a JSON schema cannot be enforced exactly, else None: a numeric bound beyond what
    llguidance enforces exactly, named by its place.
    Example: {"properties": {"n": {"minimum": 10**20}}} -> "properties.n.minimum is 100000000000000000000, ..."."""
    stack: list[tuple[str, Any, bool]] = [("", schema, False)]  # (place, node, node maps names to schemas)
    while stack:
        place, node, is_map = stack.pop()
        if isinstance(node, list):
            stack.extend((f"{place}{i}.", item, False) for i, item in reversed(list(enumerate(node))))
            continue
        if not isinstance(node, dict):
            continue
        for key in () if is_map else _BOUNDS:
            why = _inexact(node.get(key))
            if why is not None:
                text = str(node[key])
                shown = text if len(text) <= 24 else f"{text[:12]}... ({len(text)} characters)"
                return f"{place}{key} is {shown}: {why}"
        for key, value in reversed(list(node.items())):
            if not is_map and key in _DATA:
                continue
            stack.append((f"{place}{key}.", value, not is_map and key in _SCHEMA_MAPS))
    return None


def _inexact(bound: Any) -> str | None:
    """Why a numeric bound is not enforced exactly, else None (and None for what is no number)."""
    if not isinstance(bound, (int, float)) or isinstance(bound, bool):
        return None
    if isinstance(bound, float) and not math.isfinite(bound):
        return "not a finite number"
    engine = "the grammar engine reads bounds as 64-bit floats"
    if abs(bound) > EXACT_INTEGER:
        return f"beyond +-2**53 ({EXACT_INTEGER}), where bounds are no longer enforced exactly ({engine})"
    if isinstance(bound, float) and not bound.is_integer():
        digits = len(decimal.Decimal(repr(bound)).normalize().as_tuple().digits)
    else:
        digits = 0
    if digits > EXACT_DIGITS:
        return f"{digits} significant digits, more than the {EXACT_DIGITS} enforced exactly in a fraction ({engine})"
    return None


def embedded_schemas(grammar: str) -> list[Any]:
    """The JSON schemas a Lark grammar embeds (llguidance's `rule: %json {...}`), which schema_fault
    checks as it checks a json_schema constraint's. NOTE: llguidance crashes the process (not an
    error) on some integer bounds beyond 2**53 (minimum = maximum = -(2**63 - 1)): a grammar is
    a client's text, so these are checked before it reaches llguidance.
    Example: 'start: %json {"type": "integer"}' -> [{"type": "integer"}]."""
    decoder, out = json.JSONDecoder(), []
    for match in re.finditer(r"%json\s*", grammar):
        try:
            out.append(decoder.raw_decode(grammar, match.end())[0])
        except ValueError:
            continue  # not JSON: llguidance's own error names it
    return out


def grammar_definition(constraint: Constraint) -> str:
    """The llguidance grammar definition of a constraint (not yet checked against a vocabulary)."""
    import llguidance

    kind = constraint.kind
    schemas = (
        [constraint.schema]
        if kind == "json_schema"
        else embedded_schemas(constraint.source)
        if kind == "grammar"
        else []
    )
    for schema in schemas:
        fault = schema_fault(schema)
        if fault is not None:
            where = "json schema" if kind == "json_schema" else "grammar: its %json schema"
            raise ConstraintError(f"invalid {where}: {fault}")
    try:
        if kind in ("json_schema", "json_object"):
            schema = json.dumps(constraint.schema)
            return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OVERRIDES)
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(constraint.source)
        return llguidance.grammar_from("grammar", constraint.source)  # Lark, or GBNF converted to Lark
    except ValueError as exc:
        raise ConstraintError(f"invalid {kind.replace('_', ' ')}: {exc}") from None


# ---------------------------------------------------------------------- compiling
# NOTE: keyed by the loaded tokenizer object, not the model file: llama.cpp's adapter holds a
# pointer into the loaded model's vocabulary, valid only while that model is loaded.
_adapters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_adapters_lock = threading.Lock()


def llguidance_tokenizer(backend) -> Any:
    """The llguidance tokenizer of a backend's vocabulary, built once per loaded model (about
    1 s for a 150k vocabulary) and cached while the model stays loaded."""
    with _adapters_lock:
        adapter = _adapters.get(backend.tokenizer)
        if adapter is None:
            adapter = _adapters[backend.tokenizer] = backend.tokenizer.llguidance_tokenizer(backend.vocab_size)
        return adapter


def lltokenizer_from_pieces(
    tokens: Sequence[bytes], *, eos_token_id: int, special_token_ids: Sequence[int], encode, n_vocab: int
):
    """An llguidance tokenizer over explicit token bytes (special tokens get llguidance's 0xff
    mark), for vocabularies no adapter of its own covers: the toy and byte tokenizers.
    encode(bytes) -> ids tokenises text for forced strings."""
    import llguidance

    special = set(special_token_ids)

    class _Vocab:
        def __init__(self) -> None:
            self.tokens = [b"\xff" + t if i in special else t for i, t in enumerate(tokens)]
            self.eos_token_id, self.bos_token_id = eos_token_id, None
            self.special_token_ids = sorted(special)

        def __call__(self, text: bytes) -> list[int]:
            return encode(text)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocab()), n_vocab=n_vocab)


def compile_constraint(constraint: Constraint, backend) -> Grammar | LazyGrammar:
    """A fresh Grammar for one request (a LazyGrammar for a constraint with a trigger). Raises
    ConstraintError with llguidance's message."""
    import llguidance

    if constraint.trigger or constraint.pattern:
        trigger_ids = []  # a pattern alone: no token trigger
        if constraint.trigger:
            trigger_ids = backend.tokenizer.encode(constraint.trigger, add_special=False, parse_special=True)
            if not trigger_ids:
                raise ConstraintError(f"the trigger {constraint.trigger!r} has no tokens in this vocabulary")
        inner = None
        if constraint.kind != "text" and trigger_ids:
            inner = compile_constraint(Constraint(constraint.kind, constraint.source), backend)
            inner.check_start()
        eos = inner.eos_token_ids if inner is not None else llguidance_tokenizer(backend).eos_tokens
        pattern = None
        if constraint.pattern:
            start = compile_constraint(Constraint.grammar(constraint.pattern_source), backend)
            start.check_start()
            pattern = PatternTrigger(re.compile(constraint.pattern), start, backend.tokenizer)
        return LazyGrammar(trigger_ids, inner, backend.vocab_size, eos_token_ids=eos, pattern=pattern)
    grammar = grammar_definition(constraint)
    tokenizer = llguidance_tokenizer(backend)
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise ConstraintError(f"invalid {constraint.kind.replace('_', ' ')}: {_first_line(matcher.get_error())}")
    return Grammar(matcher, backend.vocab_size, eos_token_ids=tokenizer.eos_tokens)


def _first_line(message: str) -> str:
    return message.strip().split("\n<state>")[0].strip()


# ---------------------------------------------------------------------- the matcher
class Grammar:
    """One request's grammar state at the committed tokens.

    `masks(draft)` gives the allowed tokens at each of the k+1 verified positions without
    moving the state; `consume` advances it by committed tokens. Forks (for a draft model
    drafting under the grammar) advance independently.
    """

    def __init__(self, matcher, vocab_size: int, *, eos_token_ids: Sequence[int] = ()) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self._words = (vocab_size + 31) // 32
        self.num_masks = 0  # masks this Grammar computed (a fork counts its own)
        self.mask_ms = 0.0
        self._here: np.ndarray | None = None  # allowed [V] at the current state, once computed

    def fork(self) -> Grammar:
        return Grammar(self._matcher.deep_copy(), self.vocab_size, eos_token_ids=self.eos_token_ids)

    @property
    def is_stopped(self) -> bool:
        """No token but EOS can follow (the answer is complete)."""
        return self._matcher.is_stopped()

    def _bits_to_bool(self, bits: np.ndarray) -> np.ndarray:
        """int32 bitmask [n, W] -> allowed [n, V] (bool)."""
        unpacked = np.unpackbits(bits.view(np.uint8), axis=-1, bitorder="little")
        return unpacked[:, : self.vocab_size].view(bool)

    def allowed(self) -> np.ndarray:
        """allowed [V] (bool): the tokens the grammar accepts next (kept until the state moves:
        forced() and the step's masks() ask for the same state)."""
        if self._here is None:
            self._here = self._compute(())[0]
        return self._here

    def masks(self, draft_ids: Sequence[int]) -> np.ndarray:
        """allowed [len(draft_ids) + 1, V]: at the committed state and after each draft token
        (every draft token must be valid: see valid_prefix). The state does not move."""
        if not draft_ids:
            return self.allowed()[None, :]
        return np.concatenate([self.allowed()[None, :], self._compute(draft_ids)[1:]])

    def _compute(self, draft_ids: Sequence[int]) -> np.ndarray:
        t0 = time.perf_counter()
        bits = np.zeros((len(draft_ids) + 1, self._words), dtype=np.int32)
        if draft_ids:
            if not self._matcher.consume_tokens([int(t) for t in draft_ids]):
                raise ConstraintError(f"draft token outside the grammar: {self._matcher.get_error()}")
            try:
                for i in range(len(draft_ids), 0, -1):
                    self._fill(bits[i])
                    self._matcher.rollback(1)
            except BaseException:
                self._matcher.rollback(i)
                raise
        else:
            self._fill(bits[0])
        self.num_masks += len(bits) - (1 if draft_ids else 0)
        self.mask_ms += 1000 * (time.perf_counter() - t0)
        return self._bits_to_bool(bits)

    def _fill(self, row: np.ndarray) -> None:
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        # NOTE: a matcher that fails while computing a mask (a lexer or parser limit) allows
        # only EOS from then on; raise instead, or the answer would end early, breaking it.
        if self._matcher.is_error():
            raise ConstraintError(f"the constraint cannot be followed: {_first_line(self._matcher.get_error())}")

    def check_start(self) -> None:
        """Compute the first mask now, so that a constraint which fails there (a lexer or parser
        limit) or admits no answer at all is refused before the request runs."""
        allowed = np.flatnonzero(self.allowed())
        only_eos = len(allowed) <= len(self.eos_token_ids) and all(int(t) in self.eos_token_ids for t in allowed)
        if only_eos and not self._matcher.is_accepting():
            raise ConstraintError("the constraint admits no answer (no text matches it)")

    def valid_prefix(self, token_ids: Sequence[int]) -> int:
        """How many of token_ids the grammar accepts in a row from here."""
        return self._matcher.validate_tokens([int(t) for t in token_ids]) if len(token_ids) else 0

    def consume(self, token_ids: Sequence[int]) -> None:
        """Advance by committed tokens; each must be allowed (they were sampled under the mask)."""
        for token in token_ids:
            self._here = None
            if not self._matcher.consume_token(int(token)):
                # Committed tokens were allowed by the masks: only a matcher failure (a lexer or
                # parser limit reached on this input) refuses one.
                raise ConstraintError(
                    f"the constraint cannot be followed: {_first_line(self._matcher.get_error())} (at token {token})"
                )

    def forced(self, limit: int) -> list[int]:
        """The tokens the grammar forces from here (each the only token its mask allows), at
        most limit; consumed. An EOS among them ends the list (it is included)."""
        out: list[int] = []
        while len(out) < limit:
            candidates = np.flatnonzero(self.allowed())
            if len(candidates) != 1:
                break
            only = int(candidates[0])
            out.append(only)
            if only in self.eos_token_ids:
                break
            self.consume([only])
        return out

    def fast_forward(self, limit: int) -> list[int]:
        """The canonical tokens of the bytes the grammar forces from here (may still need a
        target decision: other tokenisations of those bytes can be allowed), at most limit."""
        return [int(t) for t in self._matcher.compute_ff_tokens()[:limit]]


class PatternTrigger:
    """A textual trigger: a regex searched in the free text (the last WINDOW characters), and the
    grammar that holds from its match's start, the match included (llama.cpp's pattern triggers).

    It fires at the token whose text completes a match; the grammar is then fed the text from the
    match's start to the end of that token (its canonical tokens: the grammar reads bytes, not how
    they were split), so a match that ends inside a token still starts the grammar there. A match
    whose text the grammar refuses does not fire (the answer stays free text).
    """

    WINDOW = 512  # characters: longer than any match (the pattern bounds its whitespace)

    def __init__(self, regex: re.Pattern, start: Grammar, tokenizer) -> None:
        self.regex, self._start, self._tokenizer = regex, start, tokenizer
        self._texts: dict[int, str] = {}

    def text_of(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self._tokenizer.decode([token])
        return text

    def step(self, text: str, token: int) -> tuple[Grammar | None, str]:
        """(the grammar at the end of token if it fires there, else None; the text window after it)."""
        text = (text + self.text_of(token))[-self.WINDOW :]
        match = self.regex.search(text)
        if match is None:
            return None, text
        ids = self._tokenizer.encode(text[match.start() :], add_special=False, parse_special=False)
        if self._start.valid_prefix(ids) != len(ids):
            return None, text[match.end() :]  # not a call: the text goes on free, this match spent
        grammar = self._start.fork()
        grammar.consume(ids)
        return grammar, ""

    @property
    def num_masks(self) -> int:
        return self._start.num_masks

    @property
    def mask_ms(self) -> float:
        return self._start.mask_ms


class LazyGrammar:
    """Free text until the trigger tokens, then `inner` from the token after them to the end
    (llama.cpp's lazy grammars; the trigger here is a token sequence, the canonical tokens of
    the trigger text, e.g. Qwen's single "<tool_call>" token). inner None: the trigger is
    forbidden (its last token is masked where it would complete it), the rest is free.

    The same interface as Grammar. Every row's mask is a function of the tokens before it, so
    a draft window that crosses the trigger gets free rows up to the trigger's last token and
    the inner grammar's rows after it (the bonus row included): masks() walks the draft.
    Example (trigger "#", inner "(" [a-c]+ ")"): rows for draft "x#(" are free, free, "(" only, [a-c].
    pattern: a second, textual trigger (PatternTrigger) with its own grammar; the state while
    free is then also the recent text, and a row is still a function of the tokens before it.
    """

    def __init__(
        self,
        trigger_ids: Sequence[int],
        inner: Grammar | None,
        vocab_size: int,
        *,
        eos_token_ids: Sequence[int] = (),
        tail: tuple[int, ...] = (),
        active: Grammar | None = None,
        pattern: PatternTrigger | None = None,
        text: str = "",
    ) -> None:
        self.trigger = tuple(int(t) for t in trigger_ids)
        self._pattern = pattern  # shared by forks (it keeps no state of the answer)
        self._text = text  # the recent free text, while there is a pattern and not triggered
        self._start = inner  # at its start state; never consumes (forked when the trigger fires)
        self._active = active  # the inner grammar once triggered, at the committed tokens
        self._tail = tail  # the last len(trigger) - 1 committed tokens while not triggered
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self._free: np.ndarray | None = None  # the free row [V], made once

    # -- state
    @property
    def triggered(self) -> bool:
        return self._active is not None

    def fork(self) -> LazyGrammar:
        return LazyGrammar(
            self.trigger,
            self._start.fork() if self._start is not None else None,
            self.vocab_size,
            eos_token_ids=self.eos_token_ids,
            tail=self._tail,
            active=self._active.fork() if self._active is not None else None,
            pattern=self._pattern,
            text=self._text,
        )

    def _fires(self, tail: tuple[int, ...], token: int) -> tuple[bool, tuple[int, ...]]:
        """Whether token completes the trigger after tail, and the tail after token."""
        if not self.trigger:  # the pattern alone starts the grammar
            return False, ()
        seen = (*tail, int(token))
        n = len(self.trigger)
        return seen[-n:] == self.trigger, seen[max(0, len(seen) - (n - 1)) :] if n > 1 else ()

    def _step(self, tail: tuple[int, ...], text: str, token: int) -> tuple[Grammar | None, tuple[int, ...], str]:
        """From the free state (tail, text), token: (the grammar that holds after it if a trigger
        fires there, else None; the free state after it). The token trigger's grammar is the
        shared start state (fork it before consuming); a forbidden trigger fires with None."""
        fired, tail = self._fires(tail, token)
        if fired:
            return self._start, (), ""
        if self._pattern is None:
            return None, tail, text
        grammar, text = self._pattern.step(text, token)
        return grammar, tail, text

    def _free_row(self, tail: tuple[int, ...]) -> np.ndarray:
        if self._free is None:
            self._free = np.ones(self.vocab_size, dtype=bool)
        if self._start is None and self.trigger and tail == self.trigger[:-1]:
            row = self._free.copy()
            row[self.trigger[-1]] = False  # the trigger may not complete
            return row
        return self._free

    # -- the Grammar interface
    @property
    def is_stopped(self) -> bool:
        return self._active is not None and self._active.is_stopped

    @property
    def num_masks(self) -> int:
        return sum(g.num_masks for g in (self._start, self._active, self._pattern) if g is not None)

    @property
    def mask_ms(self) -> float:
        return sum(g.mask_ms for g in (self._start, self._active, self._pattern) if g is not None)

    def allowed(self) -> np.ndarray:
        return self._active.allowed() if self._active is not None else self._free_row(self._tail)

    def masks(self, draft_ids: Sequence[int]) -> np.ndarray:
        """allowed [len(draft_ids) + 1, V] at each verified row (see the class docstring)."""
        if self._active is not None:
            return self._active.masks(draft_ids)
        rows, tail, text = [self._free_row(self._tail)], self._tail, self._text
        for i, token in enumerate(draft_ids):
            grammar, tail, text = self._step(tail, text, token)
            if grammar is not None:  # the rest of the window (and the bonus row) is the grammar's
                return np.concatenate([np.stack(rows), grammar.masks(draft_ids[i + 1 :])])
            rows.append(self._free_row(tail))
        return np.stack(rows)

    def valid_prefix(self, token_ids: Sequence[int]) -> int:
        if self._active is not None:
            return self._active.valid_prefix(token_ids)
        tail, text = self._tail, self._text
        for i, token in enumerate(token_ids):
            fired = self._fires(tail, token)[0]
            if fired and self._start is None:
                return i
            grammar, tail, text = self._step(tail, text, token)
            if grammar is not None:
                return i + 1 + grammar.valid_prefix(token_ids[i + 1 :])
        return len(token_ids)

    def consume(self, token_ids: Sequence[int]) -> None:
        for i, token in enumerate(token_ids):
            if self._active is not None:
                self._active.consume(token_ids[i:])
                return
            if self._start is None and self._fires(self._tail, token)[0]:
                raise ConstraintError(f"token {token} completes the forbidden trigger")
            grammar, self._tail, self._text = self._step(self._tail, self._text, token)
            if grammar is not None:
                self._active, self._tail, self._text = grammar.fork(), (), ""

    def forced(self, limit: int) -> list[int]:
        return self._active.forced(limit) if self._active is not None else []

    def fast_forward(self, limit: int) -> list[int]:
        return self._active.fast_forward(limit) if self._active is not None else []

    def check_start(self) -> None:
        if self._start is not None:
            self._start.check_start()


def masked(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """logits [n, V] with disallowed tokens at -inf. Example: [[1, 2]], [[True, False]] -> [[1, -inf]]."""
    return np.where(allowed, logits, -np.inf)
