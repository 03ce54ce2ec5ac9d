"""The engine: a target, its drafters and slots, with generate() and stream().

It validates requests; its slot pool (slots.py) binds them to slots and closes them; the
step itself is step.py, and the loop that runs steps is batching.Batcher, for one request
(generate/stream: a batch of one in slot 0) or many (the server). Invariant between steps:
the target cache holds every committed token but the last, which is fed together with the
next draft, so one target forward of k+1 tokens verifies k draft tokens and yields one more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace

from draftwise.backends.base import Backend, encode_chat, utf8
from draftwise.batching import SOLO_PREFILL_CHUNK, Batcher, BatchFull, Emitted, Failed
from draftwise.constraints import compile_constraint
from draftwise.drafters.base import Drafter
from draftwise.errors import ConfigError, PromptTooLongError, TokenizerMismatchError
from draftwise.policy import Policy
from draftwise.policy.cost import TargetTime
from draftwise.request import Generation, Result, Slot, ValidRequest
from draftwise.slots import SlotPool
from draftwise.types import SamplingParams, SpeculationConfig

# Characters of a prediction tokenised per token of context it may fill (see Engine.stream).
PREDICTION_CHARS_PER_TOKEN = 64

__all__ = ["Engine", "Generation", "PromptTooLongError", "Result", "TokenizerMismatchError", "check_tokenizers"]


def check_tokenizers(target: Backend, draft: Backend, sample_every: int = 97) -> None:
    """Refuse a draft whose vocabulary differs from the target's (size or token texts).

    Draft vocabularies may be padded beyond the tokenizer (Qwen: 151936 rows for 151665
    tokens), so sizes must match exactly and token texts are compared on a sample.
    """
    t_tok, d_tok = target.tokenizer, draft.tokenizer
    problem = ""
    if target.vocab_size != draft.vocab_size:
        problem = f"vocabulary sizes differ ({target.vocab_size} vs {draft.vocab_size})"
    else:
        n = min(t_tok.vocab_size, d_tok.vocab_size)
        ids = list(range(0, n, sample_every)) + list(range(max(0, n - 64), n))
        for i in ids:
            if t_tok.token_text(i) != d_tok.token_text(i):
                problem = f"token {i} is {t_tok.token_text(i)!r} in the target but {d_tok.token_text(i)!r} in the draft"
                break
        if not problem and t_tok.eos_token_ids != d_tok.eos_token_ids:
            problem = f"EOS ids differ ({sorted(t_tok.eos_token_ids)} vs {sorted(d_tok.eos_token_ids)})"
    if problem:
        raise TokenizerMismatchError(
            f"draft model {draft.name!r} does not share the tokenizer of target {target.name!r}: {problem}. "
            "Speculative decoding needs a draft of the same model family (same tokenizer)."
        )


class Engine:
    """Speculative decoding over one target backend and any number of drafters.

    generate() and stream() run one request at a time, as a Batcher of one in slot 0 (`lock`
    guards the caches); a Batcher of several slots runs requests together, one forward per
    step. A failed or cancelled request leaves the caches consistent, and the next request
    reuses the shared prompt prefix.
    """

    def __init__(
        self,
        target: Backend,
        drafters: Sequence[Drafter] = (),
        *,
        speculation: SpeculationConfig | None = None,
        policy: Policy | None = None,
        skipped_drafters: Mapping[str, str] | None = None,
    ) -> None:
        self.target = target
        self.drafters = list(drafters)
        for drafter in self.drafters:
            draft_backend = drafter.backend
            if draft_backend is not None and not drafter.own_vocabulary:
                check_tokenizers(target, draft_backend)
        self.speculation = speculation or SpeculationConfig()
        # Drafters the loader left out, and why (a draft model that cannot pay on this machine).
        self.skipped_drafters: dict[str, str] = dict(skipped_drafters or {})
        # The slots, their policies and cost model, start() and finish(): shared with every Batcher.
        self.pool = SlotPool(target, self.drafters, policy=policy, skipped_drafters=self.skipped_drafters)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def close(self) -> None:
        """Free the target's and the draft models' memory (the engine serves nothing after)."""
        for drafter in self.drafters:
            if drafter.backend is not None:
                drafter.backend.close()
        self.target.close()

    def encode_prompt(
        self, prompt: str | None = None, messages: Sequence[dict] | None = None, tools: Sequence[dict] | None = None
    ) -> list[int]:
        """Prompt ids: the text, or the messages through the chat template (with OpenAI's function
        tools rendered as the template does; see draftwise.tools for the calls' constraint)."""
        if (prompt is None) == (messages is None):
            raise ConfigError("give exactly one of prompt or messages")
        # Whatever the tokenizer does with it, text that is not valid Unicode is refused by name.
        if messages is not None:
            # message text stays text: no forged control tokens
            return encode_chat(self.tokenizer, messages, tools=tools)
        utf8(prompt)
        return self.tokenizer.encode(prompt, add_special=True)

    def generate(self, prompt: str | None = None, **kwargs) -> Result:
        gen = self.stream(prompt, **kwargs)
        for _ in gen:
            pass
        assert gen.result is not None
        return gen.result

    def stream(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[dict] | None = None,
        prompt_ids: Sequence[int] | None = None,
        sampling: SamplingParams | None = None,
        speculation: SpeculationConfig | None = None,
        cancelled: Callable[[], bool] | None = None,
        drafters: Sequence[str] | None = None,
        prediction: str | None = None,
        token_sources: bool = False,
    ) -> Generation:
        """Start a request; iterate the result for text pieces. `drafters` picks a subset by name;
        `prediction` is the expected output (OpenAI's predicted outputs), drafted from by the
        prediction drafter. token_sources: keep which drafter (or the target) wrote each token,
        as TokenSpans on the Batcher's events and in `result.spans`. Validation happens here; a
        Batcher may run the request instead."""
        if prompt_ids is None:
            prompt_ids = self.encode_prompt(prompt, messages)
        sampling = sampling or SamplingParams()
        speculation = speculation or self.speculation
        if prediction:
            utf8(prediction)
            # Only what fits the context can be drafted from: tokenise that much (a token is far
            # shorter than PREDICTION_CHARS_PER_TOKEN characters), so a huge text costs nothing.
            n_ctx = self.target.n_ctx
            ids = self.tokenizer.encode(prediction[: n_ctx * PREDICTION_CHARS_PER_TOKEN], add_special=False)
            speculation = replace(speculation, prediction=ids[:n_ctx])
        if not prompt_ids:
            raise ConfigError("the prompt is empty after tokenisation")
        if len(prompt_ids) >= self.target.n_ctx:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds {self.target.n_ctx}; "
                "shorten the prompt or raise the context size"
            )
        bad = next((t for t, _ in sampling.logit_bias if t >= self.target.vocab_size), None)
        if bad is not None:
            raise ConfigError(f"logit_bias names token {bad}, outside the vocabulary (size {self.target.vocab_size})")
        known = {d.name for d in self.drafters}
        if drafters is not None and (set(drafters) - known or len(set(drafters)) != len(drafters)):
            for name in drafters:
                if name in self.skipped_drafters:
                    raise ConfigError(f"drafter {name!r} was {self.skipped_drafters[name]}")
            raise ConfigError(
                f"unknown drafter in {list(drafters)}; this engine has: {', '.join(sorted(known)) or 'none'}"
            )
        # A bad schema or grammar fails here, before the request is queued (compiling is ~1 ms
        # once the model's tokenizer adapter is built); so does one that admits no answer.
        grammar = None
        if sampling.constraint is not None:
            grammar = compile_constraint(sampling.constraint, self.target)
            grammar.check_start()
        request = ValidRequest(
            list(prompt_ids),
            sampling,
            speculation,
            cancelled,
            None if drafters is None else tuple(drafters),
            grammar,
            token_sources,
        )
        return Generation(request, self._run)

    # ------------------------------------------------------------------ slots (the pool's)
    @property
    def lock(self):
        """Guards the caches and the busy slots (the pool's lock)."""
        return self.pool.lock

    @property
    def busy_slots(self) -> frozenset[int]:
        """The slots a Batcher is running requests in, now."""
        with self.pool.lock:
            return frozenset(self.pool.busy)

    @property
    def num_slots(self) -> int:
        return self.pool.num_slots

    def slot(self, index: int) -> Slot:
        return self.pool.slot(index)

    def target_time(self) -> TargetTime:
        return self.pool.target_time()

    def policy(self, name: str, drafters: Sequence[str] = ()) -> Policy:
        """Slot 0's policy for a policy name and drafter set (the one single requests use)."""
        return self.pool.policy_for(self.slot(0), name, drafters)

    # ------------------------------------------------------------------ one request
    def _run(self, gen: Generation) -> Iterator[str]:
        """A request alone: the same loop as a batch (a Batcher of slot 0), its text streamed."""
        with self.lock:
            batcher = Batcher(self.pool, slots=[0], prefill_chunk=SOLO_PREFILL_CHUNK)
            try:
                batcher.add(gen)
            except BatchFull:
                raise ConfigError("slot 0 is running a batched request; submit this one to the Batcher too") from None
            try:
                while batcher.active:
                    for event in batcher.step():
                        if isinstance(event, Emitted) and event.text:
                            gen.spans.extend(event.spans)
                            yield event.text
                        elif isinstance(event, Failed):
                            raise event.error  # the Batcher reset the slot's cache
            finally:
                # The consumer stopped iterating (a client went away): we sit between steps,
                # so the caches are consistent and the next request can reuse them.
                batcher.abandon()
