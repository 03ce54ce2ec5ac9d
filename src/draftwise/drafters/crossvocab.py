"""Cross-vocabulary draft model: a small LM of another family drafts target tokens, exactly.

Token-level intersection (TLI; Timor et al., ICML 2025, arXiv 2502.05202): the draft's next-token
distribution restricted to the tokens whose text is also one target token, renormalised and
mapped to target ids. Its draft_probs are rows over the TARGET vocabulary (zero outside the
intersection), so the ordinary rejection sampler stays exact at every sampling setting and
greedy drafts the argmax over the intersection. The draft's own token sequence follows the
committed text: only the last few tokens' text is re-encoded after each step, and the draft's KV
cache is rolled back and extended like ModelDrafter's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from draftwise.backends.base import Backend, Tokenizer, common_prefix_length, encode_chat, num_slots
from draftwise.constraints import masked
from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.stringlevel import DRAFT_LEVELS, propose_string, tail_text, text_of
from draftwise.errors import TokenizerMismatchError
from draftwise.sampling import History, choose_greedy, distribution, sample, softmax
from draftwise.types import ConfigError, Draft, SamplingParams, SpeculationConfig

if TYPE_CHECKING:
    from draftwise.constraints import Grammar

# How the draft sees the conversation: "template", in its own chat template (the messages read
# back from the target's prompt; plain text where that fails or the draft has none); "plain",
# as a plain transcript ("User: ...\n\nAssistant: ").
PROMPT_MODES = ("template", "plain")
# A draft whose vocabulary shares fewer of its tokens' texts with the target's than this could
# draft little: refused (by name) rather than loaded.
MIN_SHARED = 0.25
# Target tokens re-encoded before the first new one after each step: the draft's tokenizer may
# merge across the boundary of the last accepted token and the new ones ("walk" + "ing").
REENCODE_TOKENS = 2
# Anchors (positions where both tokenizations end a token) are looked for in the last this many
# target tokens of a re-encoded tail.
ANCHOR_WINDOW = 16
_SENTINEL = "\ue000"  # a private-use character no chat template writes
# The auto policy's starting acceptance per draft position (then learnt from its verdicts), from
# SmolLM2-135M drafting for Qwen2.5-Coder-1.5B on chat and math, greedy (docs/cross-vocab.md):
# string level 0.59, 0.38, 0.23 accepted by position, i.e. about 0.6 of each token given the ones
# before it; a draft of the same vocabulary starts from policy.auto.DRAFT_MODEL_PRIOR (0.7).
CROSS_VOCAB_PRIOR = (0.6, 0.6, 0.55)


# ---------------------------------------------------------------------------- the shared vocabulary
def token_texts(tokenizer: Tokenizer) -> list[str | None]:
    """Each token's text: a control token's own text ("<|im_end|>"), another's decoded text;
    None for a token without a text of its own (empty, or part of a UTF-8 character)."""
    controls = tokenizer.control_texts
    out: list[str | None] = []
    for token in range(tokenizer.vocab_size):
        raw = tokenizer.token_text(token)
        text = raw if raw in controls else tokenizer.decode([token])
        out.append(text if text and "\ufffd" not in text else None)
    return out


@dataclass(frozen=True)
class VocabMap:
    """The tokens both vocabularies share: draft_ids[i] has the text of target_ids[i].

    draft_ids, target_ids [n] int64; to_target [draft_vocab], to_draft [target_vocab] int64, -1
    where a token is not shared.
    Example: target "</s> a b c", draft "</s> c ab a" -> draft_ids [1, 3], target_ids [3, 1],
    to_target [-1, 3, -1, 1], to_draft [-1, 3, -1, 1].
    """

    draft_ids: np.ndarray
    target_ids: np.ndarray
    to_target: np.ndarray
    to_draft: np.ndarray
    target_vocab: int  # rows of the target's logits (its tokenizer's size, or more when padded)
    num_draft_tokens: int  # the draft tokenizer's tokens

    @property
    def num_shared(self) -> int:
        return len(self.draft_ids)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.draft_ids, self.target_ids, self.to_target, self.to_draft))

    def target_logits(self, draft_logits: np.ndarray) -> np.ndarray:
        """[V_draft] -> [V_target]: the shared tokens' logits at their target ids, -inf elsewhere,
        so that any distribution of them is the draft's, restricted and renormalised."""
        out = np.full(self.target_vocab, -np.inf, dtype=np.float64)
        out[self.target_ids] = draft_logits[self.draft_ids]
        return out


def shared_vocabulary(
    target: Tokenizer, target_vocab: int, draft: Tokenizer, draft_vocab: int, min_shared: float = MIN_SHARED
) -> VocabMap:
    """The intersection of two vocabularies by token text, one to one (a text either has twice
    maps its first id). Raises TokenizerMismatchError when it holds under min_shared of the draft's."""
    first_target: dict[str, int] = {}
    for token, text in enumerate(token_texts(target)[:target_vocab]):
        if text is not None:
            first_target.setdefault(text, token)
    to_target = np.full(max(draft_vocab, draft.vocab_size), -1, dtype=np.int64)
    to_draft = np.full(target_vocab, -1, dtype=np.int64)
    for token, text in enumerate(token_texts(draft)[:draft_vocab]):
        mapped = first_target.get(text) if text is not None else None
        if mapped is not None and to_draft[mapped] < 0:  # one to one: a repeated text maps once
            to_target[token], to_draft[mapped] = mapped, token
    draft_ids = np.flatnonzero(to_target >= 0)
    vocab = VocabMap(draft_ids, to_target[draft_ids], to_target, to_draft, target_vocab, draft.vocab_size)
    if vocab.num_shared < min_shared * draft.vocab_size:
        raise TokenizerMismatchError(
            f"the draft's vocabulary shares {vocab.num_shared} of its {draft.vocab_size} tokens' texts with the "
            f"target's, under the {min_shared:.0%} a draft of another vocabulary needs to draft anything useful"
        )
    return vocab


# ---------------------------------------------------------------------------- texts and prompts
@dataclass(frozen=True)
class ChatParts:
    """A chat template's wrapping: role -> (text before, text after) a message, and the text
    that asks for the answer. Read from the template by rendering a sentinel message."""

    roles: dict[str, tuple[str, str]]
    generation: str

    def parse(self, text: str) -> list[dict] | None:
        """The messages a rendered prompt holds (it must end asking for the answer); None when
        text is not such a rendering. Example (ChatML): "<|im_start|>user\\nhi<|im_end|>\\n
        <|im_start|>assistant\\n" -> [{"role": "user", "content": "hi"}]."""
        if not self.generation or not text.endswith(self.generation):
            return None
        body, messages, pos = text[: len(text) - len(self.generation)], [], 0
        by_length = sorted(self.roles.items(), key=lambda item: -len(item[1][0]))
        while pos < len(body):
            for role, (before, after) in by_length:
                if body.startswith(before, pos):
                    end = body.find(after, pos + len(before)) if after else len(body)
                    if end < 0:
                        return None
                    messages.append({"role": role, "content": body[pos + len(before) : end]})
                    pos = end + len(after)
                    break
            else:
                return None
        return messages or None


def chat_parts(tokenizer: Tokenizer) -> ChatParts | None:
    """How the tokenizer's chat template wraps system, user and assistant messages; None if it has
    no template, raises on these messages, or wraps a role in nothing it could be found by."""
    system = {"role": "system", "content": _SENTINEL}
    try:
        one = tokenizer.apply_chat_template([system], add_generation_prompt=False)
        roles = {"system": tuple(one.split(_SENTINEL))}
        for role in ("user", "assistant"):
            two = tokenizer.apply_chat_template(
                [system, {"role": role, "content": _SENTINEL}], add_generation_prompt=False
            )
            roles[role] = tuple(two[len(one) :].split(_SENTINEL)) if two.startswith(one) else ()
        asked = [system, {"role": "user", "content": _SENTINEL}]
        closed = tokenizer.apply_chat_template(asked, add_generation_prompt=False)
        generation = tokenizer.apply_chat_template(asked, add_generation_prompt=True)[len(closed) :]
    except Exception:  # noqa: BLE001 - a template that cannot render these has no parts we can use
        return None
    if any(len(parts) != 2 or not parts[0] for parts in roles.values()):
        return None
    return ChatParts({role: (parts[0], parts[1]) for role, parts in roles.items()}, generation)


def transcript(messages: Sequence[dict]) -> str:
    """The plain-text form: "User: hi\\n\\nAssistant: "."""
    turns = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages)
    return turns + "Assistant: "


def draft_prompt(
    target: Tokenizer, draft: Tokenizer, prompt: Sequence[int], mode: str, parts: ChatParts | None
) -> list[int]:
    """The draft's ids for the target's prompt: the conversation in the draft's own template
    ("template") or as a transcript ("plain"); a prompt that is no chat, as its text."""
    text = text_of(target, prompt)
    messages = parts.parse(text) if parts is not None else None
    if messages is None:
        plain = text
        for control in target.control_texts:
            plain = plain.replace(control, "")
        return draft.encode(plain, add_special=True, parse_special=False)
    if mode == "template":
        try:
            return encode_chat(draft, messages)
        except Exception:  # noqa: BLE001 - no template, or one refusing these roles: the transcript
            pass
    return draft.encode(transcript(messages), add_special=True, parse_special=False)


# ---------------------------------------------------------------------------- the drafter
class CrossVocabDrafter(ModelDrafter):
    """A draft model of another vocabulary (TLI: see the module docstring).

    State: the target ids it last drafted after (`_synced_target`), its own ids for the same text
    (`_synced_draft`) and anchors, pairs (t, d) where target_ids[:t] and draft_ids[:d] spell the
    same text. Each proposal keeps the longest shared prefix, goes back to the anchor
    REENCODE_TOKENS before the first new target token, and re-encodes only the text after it.
    """

    own_vocabulary = True
    acceptance_prior = CROSS_VOCAB_PRIOR

    def __init__(
        self,
        backend: Backend,
        target_tokenizer: Tokenizer,
        target_vocab: int,
        name: str = "draft",
        *,
        prompt_mode: str = "template",
        vocab: VocabMap | None = None,
        reencode_tokens: int = REENCODE_TOKENS,
        draft_level: str = "auto",
    ) -> None:
        if draft_level not in DRAFT_LEVELS:
            raise ConfigError(f"draft_level must be one of {', '.join(DRAFT_LEVELS)}, got {draft_level!r}")
        if prompt_mode not in PROMPT_MODES:
            raise ConfigError(f"prompt_mode must be one of {', '.join(PROMPT_MODES)}, got {prompt_mode!r}")
        if reencode_tokens < 1:
            raise ConfigError(f"reencode_tokens must be >= 1, got {reencode_tokens}")
        super().__init__(backend, name)
        self.target_tokenizer = target_tokenizer
        self.vocab = vocab or shared_vocabulary(target_tokenizer, target_vocab, backend.tokenizer, backend.vocab_size)
        self.prompt_mode = prompt_mode
        self.reencode_tokens = reencode_tokens
        #: "token" (TLI), "string" (the draft's text re-encoded: stringlevel.py) or "auto".
        self.draft_level = draft_level
        self._string = False  # this request drafts at the string level (begin)
        self.string_temperature: float | None = None
        self._parts = chat_parts(target_tokenizer)
        self._target_eos = target_tokenizer.eos_token_ids
        self._prompt: list[int] = []  # the request's prompt (target ids) and the draft's for it
        self._prompt_draft: list[int] = []
        self._synced_target: list[int] = []
        self._synced_draft: list[int] = []
        self._anchors: list[tuple[int, int]] = []
        #: Characters re-encoded by the last proposal (tests check that only the tail is).
        self.last_reencoded = ""
        #: The draft's own text written by the last string-level proposal.
        self.last_written = ""

    def memory_bytes(self) -> int:
        """The draft's KV cache in use, as ModelDrafter's, plus its vocabulary map (int64 arrays:
        the shared tokens twice, both vocabularies once; 2.0 MB for SmolLM2 drafting for Qwen2.5)."""
        return super().memory_bytes() + self.vocab.nbytes

    def for_slot(self, slot: int) -> CrossVocabDrafter:
        if num_slots(self.backend) <= slot:
            raise ConfigError(
                f"the draft model {self.backend.name!r} has {num_slots(self.backend)} slot(s); "
                f"load it with as many as the target"
            )
        return CrossVocabDrafter(
            self.backend.sequence(slot),
            self.target_tokenizer,
            self.vocab.target_vocab,
            self.name,
            prompt_mode=self.prompt_mode,
            vocab=self.vocab,
            reencode_tokens=self.reencode_tokens,
            draft_level=self.draft_level,
        )

    def begin(
        self,
        sampling: SamplingParams,
        speculation: SpeculationConfig,
        prompt: Sequence[int] = (),
        tokenizer: Tokenizer | None = None,
    ) -> None:
        super().begin(sampling, speculation, prompt, tokenizer)
        self._prompt = list(prompt)
        draft = self.backend.tokenizer
        self._prompt_draft = draft_prompt(self.target_tokenizer, draft, prompt, self.prompt_mode, self._parts)
        self._synced_target, self._synced_draft, self._anchors = [], [], []
        self._string = self.draft_level == "string" or (self.draft_level == "auto" and sampling.greedy)
        #: String-level drafts: the draft's argmax unless a draft_temperature is asked for.
        self.string_temperature = speculation.draft_temperature

    # ------------------------------------------------------------------ keeping in step
    def catch_up(self, context: Sequence[int]) -> int:
        """About how many of its own tokens the draft must feed before drafting after context
        (counted in target tokens past the text it last drafted after, plus the re-encoded tail;
        the whole prompt at a request's first proposal)."""
        synced = self._synced_target
        shared = common_prefix_length(context, synced) if synced else 0
        if not shared:
            base_t, base_ids = self._base(context)
            cached = common_prefix_length(self.backend.cached_ids, base_ids)
            return max(1, len(base_ids) - cached + len(context) - base_t)
        return max(1, len(context) - shared + self.reencode_tokens)

    def _base(self, context: Sequence[int]) -> tuple[int, list[int]]:
        """Where the draft's ids start following the target's text: after the request's prompt
        (mapped once, in begin) if context starts with it, else at the start."""
        n = len(self._prompt)
        if n and len(context) >= n and common_prefix_length(context[:n], self._prompt) == n:
            return n, self._prompt_draft
        return 0, self.backend.tokenizer.encode("", add_special=True, parse_special=False)

    def _sync(self, context: Sequence[int]) -> list[int] | None:
        """The draft's ids for context (None: its text ends inside a character), with the
        synced state and anchors updated; only the text after the chosen anchor is encoded."""
        base_t, base_ids = self._base(context)
        anchors = self._anchors
        if not anchors or anchors[0] != (base_t, len(base_ids)) or self._synced_draft[: len(base_ids)] != base_ids:
            anchors, self._synced_target, self._synced_draft = [(base_t, len(base_ids))], [], list(base_ids)
        shared = common_prefix_length(context, self._synced_target) if self._synced_target else base_t
        valid = [a for a in anchors if a[0] <= shared] or anchors[:1]
        limit = max(base_t, shared - self.reencode_tokens)
        ideal = [a for a in valid if a[0] <= limit]
        # NOTE: where no anchor lies near enough before the limit (text the draft's tokenizer does
        # not spell back exactly), re-encode from the last valid one: less than the ideal tail,
        # never a long stretch of context.
        if ideal and ideal[-1][0] >= shared - self.reencode_tokens - ANCHOR_WINDOW:
            keep = ideal
        else:
            keep = valid
        start_t, start_d = keep[-1]
        text = tail_text(self.target_tokenizer, context, start_t) if start_t < len(context) else ""
        if text.endswith("\ufffd"):
            return None  # the last token is part of a character: nothing to draft after yet
        self.last_reencoded = text
        draft_tok = self.backend.tokenizer
        tail = draft_tok.encode(text, add_special=False, parse_special=False) if text else []
        draft_ids = self._synced_draft[:start_d] + tail
        keep += self._tail_anchors(context, start_t, draft_ids, start_d, text)
        self._anchors, self._synced_target, self._synced_draft = keep, list(context), draft_ids
        return draft_ids

    def _tail_anchors(
        self, context: Sequence[int], start_t: int, draft_ids: list[int], start_d: int, text: str
    ) -> list[tuple[int, int]]:
        """Anchors in the re-encoded tail: positions in its last ANCHOR_WINDOW target tokens
        where a draft token ends at the same character, and the end itself."""
        end = (len(context), len(draft_ids))
        if not text or len(context) - start_t < 2:
            return [end] if end[0] > start_t else []
        suffix_t = {}
        for t in range(max(start_t + 1, len(context) - ANCHOR_WINDOW), len(context)):
            rest = tail_text(self.target_tokenizer, context, t)
            if text.endswith(rest):
                suffix_t[len(rest)] = t
        found = []
        draft_tok = self.backend.tokenizer
        for d in range(max(start_d + 1, len(draft_ids) - 2 * ANCHOR_WINDOW), len(draft_ids)):
            rest = tail_text(draft_tok, draft_ids, d)
            if len(rest) in suffix_t and text.endswith(rest):
                found.append((suffix_t[len(rest)], d))
        return sorted(set(found)) + [end]

    # ------------------------------------------------------------------ drafting
    def propose(self, context: Sequence[int], max_tokens: int, grammar: Grammar | None = None) -> Draft:
        self.last_confidences = []
        if max_tokens <= 0 or not context:
            return Draft((), source=self.name)
        if self._string and grammar is None:  # under a grammar, the shared tokens' masked rows
            return propose_string(self, context, max_tokens)
        draft_ids = self._sync(context)
        if draft_ids is None or not draft_ids:
            return Draft((), source=self.name)
        max_tokens = min(max_tokens, self.backend.n_ctx - len(draft_ids))
        if max_tokens <= 0:
            return Draft((), source=self.name)
        logits = self._next_logits(draft_ids)
        fork = grammar.fork() if grammar is not None else None
        target_ids: list[int] = []
        drafted: list[int] = []
        rows: list[np.ndarray] = []
        history = History(context, min(self.num_prompt_tokens, len(context)), target_ids)
        vocab = self.vocab
        # Greedy without adjustments or grammar: the argmax over the shared draft ids, no target row.
        direct = self.sampling.greedy and not self.sampling.adjusts_logits and fork is None
        for i in range(max_tokens):
            if fork is not None and fork.is_stopped:
                break
            if direct:
                probs = None
                draft_token = int(vocab.draft_ids[np.argmax(logits[vocab.draft_ids])])
                token = int(vocab.to_target[draft_token])
            else:
                row = vocab.target_logits(logits)
                if fork is not None:
                    row = masked(row, fork.allowed())
                if not np.isfinite(row).any():
                    break  # the grammar allows no shared token here
                if self.sampling.greedy:
                    probs = None
                    token = int(choose_greedy(row[None, :], self.sampling, history.at(i))[0])
                else:
                    probs = distribution(row[None, :], self.sampling, history.at(i))[0]
                    token = sample(probs, self._rng)
                draft_token = int(vocab.to_draft[token])
            if probs is not None:
                confidence = float(probs[token])
            else:
                confidence = float(softmax(logits)[draft_token]) if self.min_confidence > 0 else 1.0
            if i > 0 and confidence < self.min_confidence:
                break  # NOTE: depends on the draft only, so the output distribution is unchanged
            target_ids.append(token)
            drafted.append(draft_token)
            self.last_confidences.append(confidence)
            if probs is not None:
                rows.append(probs)
            if fork is not None:
                fork.consume([token])
            if token in self._target_eos:
                break  # nothing after an end of generation can be committed
            if i + 1 < max_tokens:
                logits = self.backend.extend([draft_token])[-1]
        self._record(context, draft_ids, target_ids, drafted)
        draft_probs = np.stack(rows) if rows else None
        return Draft(tuple(target_ids), draft_probs=draft_probs, source=self.name)

    def _record(self, context: Sequence[int], draft_ids: list[int], target_ids: list[int], drafted: list[int]) -> None:
        """The drafted tokens spell the same text in both vocabularies, token for token: each
        ends an anchor, so an accepted draft is never re-encoded beyond REENCODE_TOKENS."""
        n_t, n_d = len(context), len(draft_ids)
        self._synced_target = [*context, *target_ids]
        self._synced_draft = [*draft_ids, *drafted]
        self._anchors += [(n_t + j, n_d + j) for j in range(1, len(target_ids) + 1)]
