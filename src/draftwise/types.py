"""The data contract: frozen dataclasses that cross the seams between parts.

SamplingParams (what the request asks for), Constraint (what its output must match;
constraints.py compiles it), SpeculationConfig (how to speculate), Draft (a drafter's
proposal), Verdict (the verifier's decision) and StepStats (what one decoding step did).
Every config validates itself when built.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from draftwise.errors import ConfigError, ConstraintError


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


CONSTRAINT_KINDS = ("json_schema", "json_object", "regex", "grammar", "text")
# In Constraint.calls: where a call's text has a string value's content (CALL_HOLE) or another
# value (CALL_ANY).
CALL_HOLE, CALL_ANY = "\x00", "\x01"


@dataclass(frozen=True)
class Constraint:
    """What a request's output must match. source: the schema as JSON text, the regex, or the
    grammar text (Lark, or llama.cpp GBNF, told apart by llguidance); empty for json_object.

    trigger (lazy constraints, as for tool calls): the answer is free text until the trigger's
    tokens appear, and the constraint holds from the token after them to the end. Kind "text"
    with a trigger is free text in which the trigger never appears (tool_choice "none").
    pattern: a (second) textual trigger, a regex searched in the answer's text; from its match
    on, pattern_source (a Lark grammar of the text from the match's start, the match included)
    holds to the end. Qwen2.5-Coder writes its calls as ```json blocks. A lazy constraint with a
    pattern and no trigger is free text until the pattern matches (calls as plain JSON).
    calls: the texts of the calls the constraint admits, as the model would write them, with
    CALL_HOLE / CALL_ANY for their values; they never change what is allowed (the calls drafter
    proposes from them).

    Example: Constraint.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}).
    Example: Constraint.lazy(Constraint.grammar('start: "(" /[a-c]+/ ")"'), "#") allows
    "any text#(ab)" and "any text" but not "any text#x".
    """

    kind: str
    source: str = ""
    trigger: str = ""
    pattern: str = ""
    pattern_source: str = ""
    calls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "calls", tuple(self.calls))
        if self.kind not in CONSTRAINT_KINDS:
            raise ConfigError(f"constraint kind must be one of {', '.join(CONSTRAINT_KINDS)}, got {self.kind!r}")
        if self.kind == "text" and not self.trigger:
            raise ConfigError("a text constraint needs a trigger (the text it never holds)")
        if bool(self.pattern) != bool(self.pattern_source) or (self.pattern and self.kind == "text"):
            raise ConfigError("a pattern trigger needs its grammar (pattern_source) and a lazy constraint")
        if self.pattern:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ConstraintError(f"invalid trigger pattern: {exc}") from None
        if self.kind not in ("json_object", "text") and not self.source.strip():
            raise ConstraintError(f"the {self.kind.replace('_', ' ')} is empty")
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.source)
            except json.JSONDecodeError as exc:
                raise ConstraintError(f"the JSON schema is not valid JSON: {exc}") from None
            if not isinstance(schema, (dict, bool)):
                raise ConstraintError(f"a JSON schema must be an object (or a boolean), got {type(schema).__name__}")

    @classmethod
    def json_schema(cls, schema: dict | str) -> Constraint:
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def json_object(cls) -> Constraint:
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, text: str) -> Constraint:
        return cls("grammar", text)

    @classmethod
    def lazy(
        cls, constraint: Constraint, trigger: str, *, pattern: str = "", from_pattern: Constraint | None = None
    ) -> Constraint:
        """constraint, holding only after trigger (free text before it); or, from a match of the
        regex pattern on, from_pattern (a grammar that reads the match itself). trigger "": the
        pattern alone starts it."""
        if not trigger and not (pattern and from_pattern is not None):
            raise ConfigError("a lazy constraint needs a non-empty trigger (or a pattern and its grammar)")
        if (from_pattern is not None) and from_pattern.kind != "grammar":
            raise ConfigError("a pattern trigger's constraint must be a grammar")
        source = from_pattern.source if from_pattern is not None else ""
        return cls(constraint.kind, constraint.source, trigger, pattern, source)

    @classmethod
    def without(cls, trigger: str) -> Constraint:
        """Free text that never holds trigger (its tokens)."""
        return cls("text", "", trigger)

    @property
    def schema(self) -> Any:
        """The JSON schema this constraint stands for (json_object: any object), else None."""
        if self.kind == "json_schema":
            return json.loads(self.source)
        return {"type": "object"} if self.kind == "json_object" else None


@dataclass(frozen=True)
class SamplingParams:
    """How the target's next-token distribution is shaped and sampled.

    temperature 0 means greedy (argmax). top_k 0 and top_p 1.0 and min_p 0.0 disable
    those filters. Filters apply in the order temperature -> top-k -> top-p -> min-p.

    Logit adjustments, before the grammar mask and the filters (sampling.adjusted, in this
    order): logit_bias ((token id, bias) pairs, OpenAI's -100..100, added), repeat_penalty
    (llama.cpp: over the last repeat_last_n tokens of prompt + output, -1 all of them, a
    positive logit divided by it, a negative one multiplied; 1.0 disables it), then OpenAI's
    presence_penalty (subtracted once from every token the output holds) and frequency_penalty
    (subtracted per occurrence), counted over generated tokens only, as OpenAI and vLLM do.
    logprobs: report each generated token's logprob with that many alternatives (0..20; None:
    none); prompt_logprobs: the same for the prompt's tokens (completions' echo).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # Structured output (a Constraint): the target's logits are masked by its
    # grammar before the transforms above. A constrained answer ends with its grammar.
    constraint: Constraint | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64  # llama.cpp's default
    logit_bias: tuple[tuple[int, float], ...] = ()  # a dict {token id: bias} is accepted too
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        _check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        _check(self.top_k >= 0, f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(0 <= self.min_p < 1, f"min_p must be in [0, 1), got {self.min_p}")
        _check(self.max_tokens >= 0, f"max_tokens must be >= 0, got {self.max_tokens}")
        _check(-2 <= self.presence_penalty <= 2, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        _check(-2 <= self.frequency_penalty <= 2, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        _check(self.repeat_penalty > 0, f"repeat_penalty must be > 0 (1 disables it), got {self.repeat_penalty}")
        _check(
            self.repeat_last_n >= -1, f"repeat_last_n must be >= -1 (-1: the whole context), got {self.repeat_last_n}"
        )
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        bias = tuple(sorted((int(t), float(b)) for t, b in bias))
        _check(
            all(t >= 0 and -100 <= b <= 100 for t, b in bias),
            "logit_bias maps token ids (>= 0) to biases in [-100, 100]",
        )
        object.__setattr__(self, "logit_bias", bias)
        for name, value in (("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)):
            _check(value is None or 0 <= value <= 20, f"{name} must be in [0, 20], got {value}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        _check(all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def adjusts_logits(self) -> bool:
        """Whether logit_bias or a penalty changes the logits (each row then needs its history)."""
        return bool(
            self.logit_bias
            or self.presence_penalty
            or self.frequency_penalty
            or (self.repeat_penalty != 1.0 and self.repeat_last_n != 0)
        )


POLICIES = ("auto", "fixed", "heuristic")


@dataclass(frozen=True)
class SpeculationConfig:
    """How to speculate for one request.

    policy: "fixed" (always max_draft_tokens), "heuristic" (acceptance-rate rule),
    "auto" (calibrated cost model). draft_temperature is the drafter's own sampling
    temperature (None: same as the target's); it never changes the output distribution.
    """

    policy: str = "auto"
    max_draft_tokens: int = 4
    min_draft_tokens: int = 1
    draft_temperature: float | None = None
    enabled: bool = True
    max_branches: int = 1  # >1: token-tree drafts (greedy only; sampling falls back to chains)
    # The request's predicted output as token ids (OpenAI `prediction`; Engine.stream takes the
    # text): the prediction drafter's source. It never changes what is generated.
    prediction: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check(self.policy in POLICIES, f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        _check(
            1 <= self.max_draft_tokens <= 256, f"max_draft_tokens (k) must be in [1, 256], got {self.max_draft_tokens}"
        )
        _check(
            1 <= self.min_draft_tokens <= self.max_draft_tokens,
            f"min_draft_tokens must be in [1, max_draft_tokens={self.max_draft_tokens}], got {self.min_draft_tokens}",
        )
        _check(1 <= self.max_branches <= 16, f"max_branches must be in [1, 16], got {self.max_branches}")
        _check(
            self.draft_temperature is None or self.draft_temperature >= 0,
            f"draft_temperature must be >= 0, got {self.draft_temperature}",
        )
        object.__setattr__(self, "prediction", tuple(int(t) for t in self.prediction))


@dataclass(frozen=True)
class Draft:
    """A drafter's proposal: k' token ids and, for a sampled draft, its distributions.

    draft_probs [k', V] is the distribution each token was sampled from; None means a
    deterministic proposal, which the verifier treats as one-hot (probability 1).
    """

    token_ids: tuple[int, ...] = ()
    draft_probs: np.ndarray | None = None  # [k', V] float64, or None
    source: str = ""
    score: float = 0.0  # drafter-specific confidence (n-gram: length of the matched suffix)
    # Which of a drafter's sources the proposal came from (suffix: "live" context or
    # "history"); the auto policy estimates acceptance separately for each kind.
    kind: str = ""
    # Where in the drafter's own text the proposal's first token was copied from (a lookup's
    # source position; -1: not a copy). The auto policy tells a copy that resumes after an edit
    # (its source continues where a long copy broke off) from a new one.
    origin: int = -1

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))
        if self.draft_probs is not None:
            _check(
                self.draft_probs.ndim == 2 and self.draft_probs.shape[0] == len(self.token_ids),
                f"draft_probs must be [k={len(self.token_ids)}, V], got {self.draft_probs.shape}",
            )

    def __len__(self) -> int:
        return len(self.token_ids)

    def truncated(self, k: int) -> Draft:
        """The first k proposed tokens (and their distributions); self if already that short."""
        if len(self.token_ids) <= k:
            return self
        probs = None if self.draft_probs is None else self.draft_probs[:k]
        return Draft(self.token_ids[:k], probs, self.source, self.score, self.kind, self.origin)


@dataclass(frozen=True)
class TreeDraft:
    """Several candidate continuations verified in one target pass (greedy only).

    Example: branches ((5, 6, 7), (5, 8)) -- both start with 5; the target keeps the
    branch with the longest accepted prefix.
    """

    branches: tuple[tuple[int, ...], ...]
    source: str = ""
    score: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "branches", tuple(tuple(int(t) for t in b) for b in self.branches if len(b)))

    def __len__(self) -> int:
        """Number of draft tokens the target verifies (shared first tokens counted once)."""
        return len(_trie_tokens(self.branches))


def _trie_tokens(branches) -> set[tuple[int, ...]]:
    """Distinct prefixes (trie nodes) of the branches: each costs one verified token."""
    return {b[: i + 1] for b in branches for i in range(len(b))}


@dataclass(frozen=True)
class Verdict:
    """The verifier's decision: the first num_accepted draft tokens stand, then next_token.

    next_token is the correction (resampled from the residual at the first rejection)
    or the bonus token (sampled from the target after the last draft token).
    """

    num_accepted: int
    next_token: int

    def committed(self, draft_ids: Sequence[int]) -> list[int]:
        """Tokens to commit: [d_1..d_n, next]. Example: ([5, 6, 7], n=2, next=9) -> [5, 6, 9]."""
        return [*draft_ids[: self.num_accepted], self.next_token]


@dataclass(frozen=True)
class TokenSpan:
    """A piece of an answer's text and the token that wrote it (docs/design.md section 5).

    source: "target" (the target's own token: a plain step's, a correction, a bonus), "grammar"
    (forced by the constraint: the only token it allows), or the drafter whose draft token the
    target accepted ("ngram", "suffix", "draft", "prediction", "calls", "datastore", ...). step:
    the target forward that committed it (from 1); drafted / accepted: that step's draft tokens
    verified and kept. A token whose text ends mid-character gives its text to the next one;
    a token's text may arrive in two spans when a stream holds part of it back (a stop string).
    """

    text: str
    source: str
    step: int
    drafted: int
    accepted: int
    logprob: float | None = None  # when the request asks for logprobs


@dataclass(frozen=True)
class StepStats:
    """What one target verification step did (one target forward after the prompt)."""

    drafter: str  # "none" for a plain step
    num_drafted: int
    num_accepted: int
    num_committed: int
    draft_ms: float
    verify_ms: float
    planned_k: int = 0
    num_branches: int = 1  # > 1 for a token-tree step
    num_forced: int = 0  # grammar-forced tokens fed in the same forward (before the draft)
    # Continuous batching: rows and requests in the forward this step shared (verify_ms is that
    # forward's time); 0 rows when the request had the forward to itself.
    batch_rows: int = 0
    batch_size: int = 1
    accepted_mask: tuple[bool, ...] = field(default_factory=tuple)
