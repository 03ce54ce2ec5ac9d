"""Draft-model drafter: a small LM of the target's family proposes k tokens one by one.

It owns its backend and KV cache; before each proposal the cache is brought in step
with the committed context (the shared prefix is kept, rejected tokens are dropped),
so rollback on rejection is implicit. It samples from sampling.distribution with the
request's parameters at its own temperature (penalties and logit bias included, each draft
row given the tokens before it, as the target's rows are); the verifier receives the exact
distributions it sampled from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from draftwise.backends.base import Backend, Tokenizer, common_prefix_length, num_slots
from draftwise.constraints import masked
from draftwise.drafters.base import BaseDrafter
from draftwise.sampling import History, choose_greedy, distribution, make_rng, sample, softmax
from draftwise.types import ConfigError, Draft, SamplingParams, SpeculationConfig

if TYPE_CHECKING:
    from draftwise.constraints import Grammar

CATCH_UP_BATCH = 16  # up to this many missing tokens go in one forward with logits for the last


class ModelDrafter(BaseDrafter):
    free = False

    def __init__(self, backend: Backend, name: str = "draft") -> None:
        self.backend = backend
        self.name = name
        # The request's sampling at the draft temperature (constraint dropped: the draft follows a
        # fork of the request's grammar itself).
        self.sampling = SamplingParams()
        #: Stop drafting once the draft's probability of its next token falls below this
        #: (0 disables it). The auto policy sets it from measured costs.
        self.min_confidence = 0.0
        self._rng = make_rng(None)
        #: The request's prompt length (begin): presence/frequency count the output only.
        self.num_prompt_tokens = 0
        self.last_confidences: list[float] = []
        self.num_reused_tokens = 0
        self._first_proposal = True

    def memory_bytes(self) -> int:
        """The draft model's KV cache in use (its backend's kv_bytes()["used"]): bounded by the
        draft's n_ctx, which llama.cpp reserves whole up front (kv_bytes()["allocated"]). Its
        weights are counted apart (the backend's weight_bytes())."""
        return int(self.backend.kv_bytes()["used"])

    def for_slot(self, slot: int) -> ModelDrafter:
        """A drafter on the draft model's sequence `slot` (the draft is loaded with slots too)."""
        if num_slots(self.backend) <= slot:
            raise ConfigError(
                f"the draft model {self.backend.name!r} has {num_slots(self.backend)} slot(s); "
                f"load it with as many as the target"
            )
        return ModelDrafter(self.backend.sequence(slot), self.name)

    def begin(
        self,
        sampling: SamplingParams,
        speculation: SpeculationConfig,
        prompt: Sequence[int] = (),
        tokenizer: Tokenizer | None = None,
    ) -> None:
        t = speculation.draft_temperature
        # Same filters as the target: proposing tokens the target filtered out only wastes drafts.
        self.sampling = replace(sampling, temperature=sampling.temperature if t is None else t, constraint=None)
        self._rng = make_rng(None if sampling.seed is None else sampling.seed + 0x5EED)
        self.num_prompt_tokens = len(prompt)
        #: Cached positions reused from the previous request at this request's first proposal.
        self.num_reused_tokens = 0
        self._first_proposal = True

    def _kept(self, context: Sequence[int]) -> int:
        """Cached positions a proposal after context keeps: the shared prefix, less the last token
        of context (always fed, for its logits)."""
        return min(common_prefix_length(self.backend.cached_ids, context), len(context) - 1)

    def catch_up(self, context: Sequence[int]) -> int:
        """Tokens the draft must feed before its first draft token after context: what its cache
        lacks (the whole prompt at a request's first proposal), at least the last one."""
        return max(1, len(context) - self._kept(context))

    def _next_logits(self, context: Sequence[int]) -> np.ndarray:
        """Bring the cache to context[:-1] + feed the rest; logits [V] after context."""
        backend = self.backend
        keep = self._kept(context)
        if self._first_proposal:
            self.num_reused_tokens, self._first_proposal = keep, False
        if keep < backend.num_cached:
            backend.truncate(keep)
        missing = context[keep:]
        if len(missing) > CATCH_UP_BATCH:
            backend.prefill(missing[:-1])
            missing = missing[-1:]
        return backend.extend(missing)[-1]

    def propose(self, context: Sequence[int], max_tokens: int, grammar: Grammar | None = None) -> Draft:
        max_tokens = min(max_tokens, self.backend.n_ctx - len(context))
        self.last_confidences = []
        if max_tokens <= 0 or not context:
            return Draft((), source=self.name)
        logits = self._next_logits(context)
        # Under a constraint the draft samples from its own masked distribution (a fork of the
        # request's grammar follows the draft), so draft_probs stay what it sampled from.
        fork = grammar.fork() if grammar is not None else None
        token_ids: list[int] = []
        rows: list[np.ndarray] = []
        history = History(context, min(self.num_prompt_tokens, len(context)), token_ids)  # row i: d_1..d_i too
        for i in range(max_tokens):
            if fork is not None:
                if fork.is_stopped:
                    break
                logits = masked(logits, fork.allowed())
            if self.sampling.greedy:
                probs = None
                token = int(choose_greedy(logits[None, :], self.sampling, history.at(i))[0])
                confidence = float(softmax(logits)[token]) if self.min_confidence > 0 else 1.0
            else:
                probs = distribution(logits[None, :], self.sampling, history.at(i))[0]
                token = sample(probs, self._rng)
                confidence = float(probs[token])
            if i > 0 and confidence < self.min_confidence:
                break  # NOTE: depends on the draft only, so the output distribution is unchanged
            token_ids.append(token)
            self.last_confidences.append(confidence)
            if probs is not None:
                rows.append(probs)
            if fork is not None:
                if token in fork.eos_token_ids:
                    break
                fork.consume([token])
            if i + 1 < max_tokens:
                logits = self.backend.extend([token])[-1]
        draft_probs = np.stack(rows) if rows else None
        return Draft(tuple(token_ids), draft_probs=draft_probs, source=self.name)

    def accept(self, num_accepted: int) -> None:
        pass  # the cache is re-synced against the committed context on the next proposal
