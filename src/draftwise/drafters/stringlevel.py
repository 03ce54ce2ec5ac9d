"""String-level drafting across vocabularies (Timor et al., ICML 2025, arXiv 2502.05202: SLEM).

The draft model decodes freely in its own vocabulary (its argmax, or at the request's
draft_temperature a sample from its own distribution), its text is re-encoded with the target's
tokenizer, and the target tokens go to the verifier as a deterministic draft (draft_probs None).
That is exact at every setting: greedy verification compares argmaxes, and the rejection sampler
accepts a one-hot draft token x with probability target(x) and otherwise samples the target with
x removed, whatever chose x.

Only target tokens that start at the end of the committed text are drafted (a target token that
would merge across it, "\\n" + "\\n" -> "\\n\\n", is not: the new text is then encoded alone), and
the last one is dropped unless the draft ended its text: more text could merge into it ("wor" +
"ld"). The draft's own sequence is kept in step by CrossVocabDrafter._sync (its cache rolled back
to the committed text, the re-encoded tail fed), as for token-level drafting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from draftwise.backends.base import Tokenizer
from draftwise.sampling import distribution, sample, softmax
from draftwise.types import Draft, SamplingParams

if TYPE_CHECKING:
    from draftwise.drafters.model import ModelDrafter

# How a drafter of another vocabulary drafts: "token" (TLI, draft_probs over the shared tokens),
# "string" (the draft's own text re-encoded, deterministic), "auto" (string when greedy, else token:
# the choice measured in docs/cross-vocab.md).
DRAFT_LEVELS = ("auto", "string", "token")
# Draft-model tokens a proposal may write per target token asked for (plus two): the draft's
# tokens may be shorter than the target's.
DRAFT_TOKENS_PER_TARGET = 2


def text_of(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    """The text of ids with control tokens written as their own text (decode drops them)."""
    controls = tokenizer.control_texts
    parts, run = [], []
    for token in ids:
        raw = tokenizer.token_text(token) if controls else ""
        if raw in controls and raw:
            if run:
                parts.append(tokenizer.decode(run))
                run = []
            parts.append(raw)
        else:
            run.append(token)
    if run:
        parts.append(tokenizer.decode(run))
    return "".join(parts)


def tail_text(tokenizer: Tokenizer, ids: Sequence[int], start: int) -> str:
    """The text ids[start:] add to ids[:start]: decoded after the token before it, so that a
    tokenizer that drops a sequence's leading space (sentencepiece) keeps it here."""
    if start == 0:
        return text_of(tokenizer, ids)
    before = text_of(tokenizer, ids[start - 1 : start])
    both = text_of(tokenizer, ids[start - 1 :])
    return both[len(before) :] if both.startswith(before) else text_of(tokenizer, ids[start:])


@dataclass(frozen=True)
class Reencoded:
    """Target tokens for new text after committed text: token_ids spell new_text[:num_chars]."""

    token_ids: tuple[int, ...]
    num_chars: int


def boundaries(tokenizer: Tokenizer, ids: Sequence[int], text: str) -> list[tuple[int, int]]:
    """(i, n): ids[:i] spell text[:n] exactly, for each i where they do (a token ending inside a
    UTF-8 character spells no prefix). Example (characters): ids of "ab", "ab" -> [(0, 0), (1, 1), (2, 2)]."""
    out = [(0, 0)]
    for i in range(1, len(ids) + 1):
        spelled = text_of(tokenizer, ids[:i])
        if len(spelled) > out[-1][1] and text.startswith(spelled):
            out.append((i, len(spelled)))
    return out


def reencode(tokenizer: Tokenizer, committed: str, new_text: str, complete: bool) -> Reencoded:
    """The target's tokens for new_text written after committed (the last few committed tokens'
    text, so that the target's tokenizer sees the boundary): only tokens starting at the end of
    committed, and without the last one unless complete (more text could merge into it).

    Example (pieces "a", "b", "ab", " "): committed "a", new "b a" -> "ab" would start inside the
    committed text, so "b a" is encoded alone: ["b", " "] ("a" dropped), or ["b", " ", "a"] if complete.
    """
    full = committed + new_text
    ids = tokenizer.encode(full, add_special=False, parse_special=False) if full else []
    bounds = boundaries(tokenizer, ids, full)
    start = next((i for i, n in bounds if n == len(committed)), None)
    if start is None:  # a token merges across the committed end: the new text on its own
        full, committed = new_text, ""
        ids = tokenizer.encode(new_text, add_special=False, parse_special=False) if new_text else []
        bounds, start = boundaries(tokenizer, ids, new_text), 0
    after = [(i, n) for i, n in bounds if i > start]
    if not complete and after and after[-1][1] == len(full):
        after = after[:-1]
    if not after:
        return Reencoded((), 0)
    end, num_chars = after[-1]
    return Reencoded(tuple(int(t) for t in ids[start:end]), num_chars - len(committed))


def own_sampling(sampling: SamplingParams, temperature: float | None) -> SamplingParams:
    """The draft's sampling in its own vocabulary: the filters only (logit bias and penalties name
    target ids), at `temperature`, the request's draft_temperature; None: its argmax. A one-hot
    draft token x is accepted with probability target(x), so the draft's best guess of the
    target's likeliest token is accepted most, at every temperature, and exact whatever chose it."""
    return SamplingParams(
        temperature=temperature or 0.0, top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p
    )


def _ends_text(tokenizer: Tokenizer, token: int) -> bool:
    """The draft's end of generation, or any control token (an end of turn, a new turn)."""
    return token in tokenizer.eos_token_ids or tokenizer.token_text(token) in tokenizer.control_texts


def propose_string(drafter: ModelDrafter, context: Sequence[int], max_tokens: int) -> Draft:  # a CrossVocabDrafter
    """A string-level proposal of at most max_tokens target tokens after context (see the module
    docstring); the draft writes at most DRAFT_TOKENS_PER_TARGET * max_tokens + 2 of its own."""
    drafter.last_confidences = []
    empty = Draft((), source=drafter.name)
    draft_ids = drafter._sync(context)
    if not draft_ids:
        return empty
    budget = min(DRAFT_TOKENS_PER_TARGET * max_tokens + 2, drafter.backend.n_ctx - len(draft_ids))
    if budget <= 0:
        return empty
    base_t, _ = drafter._base(context)
    start = max(base_t, len(context) - drafter.reencode_tokens)
    committed = tail_text(drafter.target_tokenizer, context, start) if start < len(context) else ""
    if committed.endswith("\ufffd"):
        committed = ""  # the committed text ends inside a character: encode the new text alone
    draft_tok, sampling = drafter.backend.tokenizer, own_sampling(drafter.sampling, drafter.string_temperature)
    logits = drafter._next_logits(draft_ids)
    drafted: list[int] = []
    proposal, complete = Reencoded((), 0), False
    for i in range(budget):
        if sampling.greedy:
            token = int(np.argmax(logits))
            confidence = float(softmax(logits)[token]) if drafter.min_confidence > 0 else 1.0
        else:
            probs = distribution(logits[None, :], sampling)[0]
            token = sample(probs, drafter._rng)
            confidence = float(probs[token])
        if i > 0 and confidence < drafter.min_confidence:
            break  # NOTE: depends on the draft only, so the output distribution is unchanged
        if _ends_text(draft_tok, token):
            complete = True
            break
        drafted.append(token)
        text = tail_text(draft_tok, [*draft_ids, *drafted], len(draft_ids))
        if not text.endswith("\ufffd"):
            proposal = reencode(drafter.target_tokenizer, committed, text, complete=False)
            if len(proposal.token_ids) >= max_tokens:
                break
        if i + 1 < budget:
            logits = drafter.backend.extend([token])[-1]
    if complete and drafted:
        text = tail_text(draft_tok, [*draft_ids, *drafted], len(draft_ids))
        if not text.endswith("\ufffd"):
            proposal = reencode(drafter.target_tokenizer, committed, text, complete=True)
    token_ids = proposal.token_ids[:max_tokens]
    drafter.last_confidences = [1.0] * len(token_ids)
    drafter.last_written = tail_text(draft_tok, [*draft_ids, *drafted], len(draft_ids)) if drafted else ""
    return Draft(token_ids, source=drafter.name)
