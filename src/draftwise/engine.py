"""The engine: the draft -> verify -> commit loop, with generate() and stream().

It owns positions and caches. Invariant between steps: the target cache holds every
committed token but the last, which is fed together with the next draft, so one
target forward of k+1 tokens verifies k draft tokens and yields one more.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence

import numpy as np

from draftwise.backends.base import Backend, sync_cache, utf8
from draftwise.constraints import Grammar, compile_constraint, masked
from draftwise.drafters.base import Drafter
from draftwise.metrics import RequestStats
from draftwise.policy import PlanState, Policy, make_policy
from draftwise.sampling import LazyTargetProbs, make_rng
from draftwise.types import ConfigError, Draft, SamplingParams, SpeculationConfig, StepStats, TreeDraft
from draftwise.verify import greedy_verify, greedy_verify_tree, rejection_sample


class PromptTooLongError(ConfigError):
    """The prompt leaves no room in the context window."""


class TokenizerMismatchError(ValueError):
    """Draft and target do not share a tokenizer."""


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: RequestStats
    prompt_ids: list[int] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        return self.stats.finish_reason

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, **self.stats.to_dict()}


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


class _StreamDecoder:
    """Incremental detokenisation that never emits half a UTF-8 character."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self._prefix, self._read = 0, 0

    def push(self, ids: Sequence[int]) -> None:
        self.ids.extend(ids)
        prefix_text = self.tokenizer.decode(self.ids[self._prefix : self._read])
        new_text = self.tokenizer.decode(self.ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.text += new_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self.ids)

    def flush(self) -> None:
        tail = self.tokenizer.decode(self.ids[self._prefix :])
        prefix_text = self.tokenizer.decode(self.ids[self._prefix : self._read])
        if len(tail) > len(prefix_text):
            self.text += tail[len(prefix_text) :]
        self._prefix = self._read = len(self.ids)


class Generation:
    """An iterator of text pieces; after it is exhausted, `.result` holds the Result."""

    def __init__(self, pieces: Iterator[str]) -> None:
        self._pieces = pieces
        self.result: Result | None = None

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        """Abandon the request between steps; the engine stays ready for the next one."""
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()


class Engine:
    """Speculative decoding over one target backend and any number of drafters.

    One request at a time (a lock guards the caches); a failed or cancelled request
    leaves the caches consistent, and the next request reuses the shared prompt prefix.
    """

    def __init__(
        self,
        target: Backend,
        drafters: Sequence[Drafter] = (),
        *,
        speculation: SpeculationConfig | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.target = target
        self.drafters = list(drafters)
        for drafter in self.drafters:
            draft_backend = getattr(drafter, "backend", None)
            if draft_backend is not None:
                check_tokenizers(target, draft_backend)
        self.speculation = speculation or SpeculationConfig()
        # Drafters the loader left out, and why (a draft model that cannot pay on this machine).
        self.skipped_drafters: dict[str, str] = {}
        self._policies: dict[tuple[str, tuple[str, ...]], Policy] = {}
        self._policy_override = policy
        self._lock = threading.Lock()

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def policy(self, name: str, drafters: Sequence[str] = ()) -> Policy:
        """The policy for one policy name and drafter set; it persists across requests, so learned
        estimates carry over. Requests naming another subset of drafters get their own state, so
        (e.g. in the bench) what one configuration learned never flatters another's figures."""
        if self._policy_override is not None:
            return self._policy_override
        key = (name, tuple(sorted(drafters)))
        if key not in self._policies:
            kwargs = {"target": self.target} if name == "auto" else {}
            self._policies[key] = make_policy(name, **kwargs)
        return self._policies[key]

    def encode_prompt(self, prompt: str | None = None, messages: Sequence[dict] | None = None) -> list[int]:
        if (prompt is None) == (messages is None):
            raise ConfigError("give exactly one of prompt or messages")
        # Whatever the tokenizer does with it, text that is not valid Unicode is refused by name.
        if messages is not None:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            utf8(text)
            return self.tokenizer.encode(text, add_special=True)
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
    ) -> Generation:
        """Start a request; iterate the result for text pieces. `drafters` picks a subset by name;
        `prediction` is the expected output (OpenAI's predicted outputs), drafted from by the
        prediction drafter."""
        if prompt_ids is None:
            prompt_ids = self.encode_prompt(prompt, messages)
        sampling = sampling or SamplingParams()
        speculation = speculation or self.speculation
        if prediction:
            utf8(prediction)
            speculation = replace(speculation, prediction=self.tokenizer.encode(prediction, add_special=False))
        if not prompt_ids:
            raise ConfigError("the prompt is empty after tokenisation")
        if len(prompt_ids) >= self.target.n_ctx:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds {self.target.n_ctx}; "
                "shorten the prompt or raise the context size"
            )
        gen = Generation(iter(()))
        chosen = self.drafters if drafters is None else [d for d in self.drafters if d.name in drafters]
        if drafters is not None and len(chosen) != len(set(drafters)):
            known = ", ".join(d.name for d in self.drafters) or "none"
            for name in drafters:
                if name in self.skipped_drafters:
                    raise ConfigError(f"drafter {name!r} was {self.skipped_drafters[name]}")
            raise ConfigError(f"unknown drafter in {list(drafters)}; this engine has: {known}")
        # A bad schema or grammar fails here, before the request is queued (compiling is ~1 ms
        # once the model's tokenizer adapter is built).
        grammar = None if sampling.constraint is None else compile_constraint(sampling.constraint, self.target)
        gen._pieces = self._run(list(prompt_ids), sampling, speculation, cancelled, gen, chosen, grammar)
        return gen

    # ------------------------------------------------------------------ the loop
    def _run(self, prompt_ids: list[int], sampling: SamplingParams, speculation: SpeculationConfig,
             cancelled: Callable[[], bool] | None, gen: Generation, drafters: list[Drafter],
             grammar: Grammar | None) -> Iterator[str]:
        with self._lock:
            drafters = drafters if speculation.enabled else []
            req = _Request(
                sampling=sampling, context=list(prompt_ids), rng=make_rng(sampling.seed),
                policy=self.policy(speculation.policy, [d.name for d in drafters]),
                stats=RequestStats(num_prompt_tokens=len(prompt_ids)),
                grammar=grammar, fast_forward=speculation.enabled)
            req.policy.begin(drafters, speculation)
            for drafter in drafters:
                drafter.begin(sampling, speculation)
            stats = req.stats
            decoder = _StreamDecoder(self.tokenizer)
            stop_hold = max((len(s) for s in sampling.stop), default=1) - 1
            emitted = 0
            stop_at: int | None = None
            # A constrained answer ends when its grammar does, whatever ignore_eos says.
            eos_ids = self.tokenizer.eos_token_ids if not sampling.ignore_eos or req.grammar else frozenset()

            try:
                # 1. Prefill: the target cache holds the prompt but its last token.
                t0 = time.perf_counter()
                stats.num_reused_tokens = sync_cache(self.target, prompt_ids[:-1])
                stats.prefill_ms = 1000 * (time.perf_counter() - t0)
                t_decode = time.perf_counter()
                while not stats.finish_reason:
                    if cancelled is not None and cancelled():
                        stats.finish_reason = "cancelled"
                        break
                    new_ids = self._step(req)
                    if new_ids is None:
                        stats.finish_reason = "length"
                        break
                    # 6. Stop conditions, token by token, then stream the new text.
                    for token in new_ids:
                        if token in eos_ids:
                            stats.finish_reason = "stop"
                            stats.num_eos = 1
                            break
                        req.generated.append(token)
                        req.context.append(token)
                        if len(req.generated) >= sampling.max_tokens:
                            stats.finish_reason = "length"
                            break
                    decoder.push(req.context[len(prompt_ids) + len(decoder.ids):])
                    if sampling.stop:
                        stop_at = _find_stop(decoder.text, sampling.stop, emitted - stop_hold)
                        if stop_at is not None:
                            stats.finish_reason = "stop"
                    if stats.finish_reason:
                        break
                    ready = len(decoder.text) - stop_hold
                    if ready > emitted:
                        yield decoder.text[emitted:ready]
                        emitted = ready
                # 7. Finish: flush the last bytes, cut at a stop string, stream the rest.
                if stop_at is None:
                    decoder.flush()
                    if sampling.stop:
                        stop_at = _find_stop(decoder.text, sampling.stop, emitted - stop_hold)
                text = decoder.text if stop_at is None else decoder.text[:stop_at]
                stats.decode_ms = 1000 * (time.perf_counter() - t_decode)
                stats.num_generated = len(req.generated)
                stats.policy = req.policy.snapshot()
                stats.num_draft_reused_tokens = sum(getattr(d, "num_reused_tokens", 0) for d in drafters)
                stats.skipped_drafters = dict(self.skipped_drafters)
                if req.grammar is not None:
                    stats.num_masks, stats.mask_ms = req.grammar.num_masks, req.grammar.mask_ms
                if len(text) > emitted:
                    yield text[emitted:]
                gen.result = Result(text=text, token_ids=req.generated, stats=stats, prompt_ids=prompt_ids)
            except GeneratorExit:
                # The consumer stopped iterating (a client went away): we sit between steps,
                # so the caches are consistent and the next request can reuse them.
                raise
            except BaseException:
                # A failed request must not poison the next one: forget the cache contents.
                self.target.reset()
                raise

    def _step(self, req: _Request) -> list[int] | None:
        """One speculative step: forced tokens -> plan -> draft -> verify -> commit.

        Returns the tokens to commit (the caller applies stop conditions), or None when
        nothing fits (context window or max_tokens). Advances the target cache and the grammar.
        """
        target, sampling, grammar = self.target, req.sampling, req.grammar
        remaining = sampling.max_tokens - len(req.generated)
        # 1. Forced tokens: where the grammar allows a single token, its masked probability is 1,
        # so it is committed with no decision; the target needs only its KV entry, which this
        # step's forward writes (no logits row). Plain decoding (speculation off) decodes them
        # one per forward like any other token.
        forced = []
        if grammar is not None and req.fast_forward:
            forced = grammar.forced(min(remaining, target.n_ctx - len(req.context)))
        req.stats.num_forced_tokens += len(forced)
        if forced and (forced[-1] in grammar.eos_token_ids or len(forced) >= remaining):
            return forced
        context = req.context + forced if forced else req.context
        # 2. Plan: which drafter and how many tokens; never past the window or max_tokens.
        max_k = min(target.n_ctx - len(context), remaining - len(forced) - 1)
        if max_k < 0:
            return forced or None
        # 3. Draft (draft_ms counts planning too: free drafters propose inside plan()).
        t_step = time.perf_counter()
        plan = req.policy.plan(PlanState(context=context, max_k=max_k, greedy=sampling.greedy, grammar=grammar,
                                         num_forced=len(forced)))
        draft = plan.draft
        if draft is None:
            draft = plan.drafter.propose(context, plan.k, grammar) if plan.drafter is not None and plan.k > 0 else Draft()
        trees = sampling.greedy and grammar is None and hasattr(target, "extend_tree")
        draft = _fit(draft, max_k, getattr(target, "n_seq_max", 16) if trees else 1)
        if grammar is not None and len(draft):
            draft = draft.truncated(grammar.valid_prefix(draft.token_ids))
        t_verify = time.perf_counter()
        if isinstance(draft, TreeDraft):
            # 4'. Verify every branch in one target pass; keep the longest accepted one.
            branch_logits = target.extend_tree(context[-1], draft.branches)  # [k_b+1, V] each
            branch, verdict = greedy_verify_tree(draft.branches, [np.argmax(x, axis=-1) for x in branch_logits])
            target.commit_branch(branch, verdict.num_accepted)
            draft_ids = draft.branches[branch]
        else:
            # 4. Verify: one target forward over [uncached committed tail, d_1..d_k] with logits
            # for the k+1 rows [last committed, d_1..d_k]; under a grammar, rows are masked.
            pending = context[target.num_cached:]  # [last]; more after forced tokens
            logits = target.extend([*pending, *draft.token_ids], num_logits=len(draft) + 1)  # [k+1, V]
            if grammar is not None:
                logits = masked(logits, grammar.masks(draft.token_ids))
            if sampling.greedy:
                verdict = greedy_verify(draft.token_ids, np.argmax(logits, axis=-1))
            else:
                verdict = rejection_sample(draft, LazyTargetProbs(logits, sampling), req.rng)
            # 5. Commit: keep d_1..d_n in the cache, drop the rejected rest.
            target.truncate(len(context) + verdict.num_accepted)
            draft_ids = draft.token_ids
        t_end = time.perf_counter()
        committed = verdict.committed(draft_ids)
        if grammar is not None:
            grammar.consume([t for t in committed if t not in grammar.eos_token_ids])
        step = StepStats(
            drafter=draft.source if len(draft) else "none",
            num_drafted=len(draft), num_accepted=verdict.num_accepted,
            num_committed=len(committed) + len(forced), draft_ms=1000 * (t_verify - t_step),
            verify_ms=1000 * (t_end - t_verify), planned_k=plan.k,
            num_branches=len(draft.branches) if isinstance(draft, TreeDraft) else 1,
            num_forced=len(forced),
        )
        req.stats.record(step)
        if plan.drafter is not None and len(draft):
            plan.drafter.accept(verdict.num_accepted)
        req.policy.observe(step)
        return forced + committed


@dataclass
class _Request:
    """One request's state between steps: what the step reads and advances."""

    sampling: SamplingParams
    context: list[int]  # prompt + committed tokens
    rng: np.random.Generator
    policy: Policy
    stats: RequestStats
    grammar: Grammar | None = None
    fast_forward: bool = True  # commit grammar-forced tokens without a decision (speculation on)
    generated: list[int] = field(default_factory=list)


def _fit(draft: Draft | TreeDraft, max_k: int, max_branches: int) -> Draft | TreeDraft:
    """Trim a proposal to max_k tokens per branch and to the branches the target can hold;
    a single branch becomes a chain (trees are greedy-only; sampling keeps exact chain
    verification, so a tree under sampling is reduced to its first branch)."""
    if isinstance(draft, TreeDraft):
        branches = tuple(b[:max_k] for b in draft.branches if max_k > 0 and len(b))[:max_branches]
        if len(branches) > 1:
            return TreeDraft(branches, draft.source, draft.score)
        return Draft(branches[0] if branches else (), None, draft.source, draft.score)  # trees have no kind
    return draft.truncated(max_k)


def _find_stop(text: str, stops: Sequence[str], start: int) -> int | None:
    """Index of the earliest stop string in text at or after start (clamped), else None."""
    start = max(0, start)
    best = None
    for s in stops:
        i = text.find(s, start)
        if i >= 0 and (best is None or i < best):
            best = i
    return best
