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

from draftwise.backends.base import Backend, extend_batch, num_slots, sync_cache, utf8
from draftwise.constraints import Grammar, compile_constraint, masked
from draftwise.drafters.base import Drafter
from draftwise.metrics import RequestStats
from draftwise.policy import Plan, PlanState, Policy, make_policy
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
    """An iterator of text pieces; after it is exhausted, `.result` holds the Result.

    `.request` is the validated request: a Batcher runs it in a slot instead (then the
    Generation is not iterated, and the Batcher sets `.result`)."""

    def __init__(self, pieces: Iterator[str]) -> None:
        self._pieces = pieces
        self.result: Result | None = None
        self.request: _Spec | None = None

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

    generate() and stream() run one request at a time (a lock guards the caches); a Batcher
    (batching.py) runs several together in the target's slots, one forward per step. A failed
    or cancelled request leaves the caches consistent, and the next request reuses the shared
    prompt prefix.
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
        self._policies: dict[tuple[int, str, tuple[str, ...]], Policy] = {}
        self._policy_override = policy
        self._slots: list[_Slot] = []
        self._target_time = None  # policy_auto.TargetTime, made with the first auto policy
        self.last_rows = 0  # target rows in the last step's forward
        self.busy_slots: set[int] = set()  # slots a Batcher is running requests in
        self._lock = threading.Lock()

    @property
    def tokenizer(self):
        return self.target.tokenizer

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
        prediction drafter. Validation happens here; a Batcher may run the request instead."""
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
        known = {d.name for d in self.drafters}
        if drafters is not None and (set(drafters) - known or len(set(drafters)) != len(drafters)):
            for name in drafters:
                if name in self.skipped_drafters:
                    raise ConfigError(f"drafter {name!r} was {self.skipped_drafters[name]}")
            raise ConfigError(f"unknown drafter in {list(drafters)}; this engine has: {', '.join(sorted(known)) or 'none'}")
        # A bad schema or grammar fails here, before the request is queued (compiling is ~1 ms
        # once the model's tokenizer adapter is built).
        grammar = None if sampling.constraint is None else compile_constraint(sampling.constraint, self.target)
        gen = Generation(iter(()))
        gen.request = _Spec(list(prompt_ids), sampling, speculation, cancelled,
                            None if drafters is None else tuple(drafters), grammar)
        gen._pieces = self._run(gen)
        return gen

    # ------------------------------------------------------------------ slots
    @property
    def num_slots(self) -> int:
        return num_slots(self.target)

    def slot(self, index: int) -> _Slot:
        """Slot `index`: a target sequence with drafters of its own (slot 0: the engine's)."""
        while len(self._slots) <= index:
            i = len(self._slots)
            if i >= self.num_slots:
                raise ConfigError(f"this engine has {self.num_slots} slot(s); load the target with more")
            if i == 0:
                self._slots.append(_Slot(0, self.target, list(self.drafters)))
                continue
            drafters = []
            for d in self.drafters:
                for_slot = getattr(d, "for_slot", None)
                if for_slot is None:
                    raise ConfigError(f"drafter {d.name!r} cannot serve parallel slots")
                drafters.append(for_slot(i))
            self._slots.append(_Slot(i, self.target.sequence(i), drafters))
        return self._slots[index]

    def target_time(self):
        """The target's cost model shared by every auto policy of this engine (calibrated once)."""
        if self._target_time is None:
            from draftwise.policy_auto import MAX_K, TargetTime

            self._target_time = TargetTime(self.target, max_n=MAX_K + 1)
        return self._target_time

    def _policy_for(self, slot: _Slot, name: str, drafters: Sequence[str]) -> Policy:
        """The policy for one slot, policy name and drafter set; it persists across requests, so
        learned estimates carry over. Requests naming another subset of drafters get their own
        state, so (e.g. in the bench) what one configuration learned never flatters another's."""
        if self._policy_override is not None:
            if slot.index:  # its per-request state would mix requests decoding side by side
                raise ConfigError("an engine given one policy object serves one slot; let it make its policies")
            return self._policy_override
        key = (slot.index, name, tuple(sorted(drafters)))
        if key not in self._policies:
            kwargs = {"target": self.target, "time": self.target_time()} if name == "auto" else {}
            self._policies[key] = make_policy(name, **kwargs)
        return self._policies[key]

    def policy(self, name: str, drafters: Sequence[str] = ()) -> Policy:
        """Slot 0's policy for a policy name and drafter set (the one single requests use)."""
        return self._policy_for(self.slot(0), name, drafters)

    def start(self, spec: _Spec, slot: _Slot) -> _Request:
        """Bind a validated request to a slot: its drafters, policy and cache (not yet filled)."""
        speculation = spec.speculation
        names = spec.drafters
        drafters = [d for d in slot.drafters if names is None or d.name in names] if speculation.enabled else []
        policy = self._policy_for(slot, speculation.policy, [d.name for d in drafters])
        sampling = spec.sampling
        req = _Request(
            sampling=sampling, context=list(spec.prompt_ids), rng=make_rng(sampling.seed), policy=policy,
            stats=RequestStats(num_prompt_tokens=len(spec.prompt_ids)), grammar=spec.grammar,
            fast_forward=speculation.enabled, slot=slot, drafters=drafters, prompt_ids=list(spec.prompt_ids),
            decoder=_StreamDecoder(self.tokenizer),
            stop_hold=max((len(s) for s in sampling.stop), default=1) - 1,
            # A constrained answer ends when its grammar does, whatever ignore_eos says.
            eos_ids=self.tokenizer.eos_token_ids if not sampling.ignore_eos or spec.grammar else frozenset(),
            cancelled=spec.cancelled, t_decode=time.perf_counter())
        policy.begin(drafters, speculation)
        for drafter in drafters:
            drafter.begin(sampling, speculation)
        return req

    # ------------------------------------------------------------------ the loop
    def _run(self, gen: Generation) -> Iterator[str]:
        with self._lock:
            if 0 in self.busy_slots:
                raise ConfigError("slot 0 is running a batched request; submit this one to the Batcher too")
            req = self.start(gen.request, self.slot(0))
            stats = req.stats
            try:
                # 1. Prefill: the target cache holds the prompt but its last token.
                t0 = time.perf_counter()
                stats.num_reused_tokens = sync_cache(req.slot.target, req.prompt_ids[:-1])
                stats.prefill_ms = 1000 * (time.perf_counter() - t0)
                req.t_decode = time.perf_counter()
                while not stats.finish_reason:
                    if req.cancelled is not None and req.cancelled():
                        stats.finish_reason = "cancelled"
                        break
                    piece = req.push(self.steps([req], trees=True)[0])
                    if piece:
                        yield piece
                piece = self.finish(req)
                if piece:
                    yield piece
                gen.result = req.result
            except GeneratorExit:
                # The consumer stopped iterating (a client went away): we sit between steps,
                # so the caches are consistent and the next request can reuse them.
                raise
            except BaseException:
                # A failed request must not poison the next one: forget the cache contents.
                req.slot.target.reset()
                raise

    def finish(self, req: _Request) -> str:
        """Close a request: flush the last bytes, cut at a stop string; returns the rest of the
        text and sets req.result."""
        stats = req.stats
        if not stats.finish_reason:
            stats.finish_reason = "cancelled"
        text = req.flush()
        stats.decode_ms = 1000 * (time.perf_counter() - req.t_decode)
        stats.num_generated = len(req.generated)
        stats.policy = req.policy.snapshot()
        stats.num_draft_reused_tokens = sum(getattr(d, "num_reused_tokens", 0) for d in req.drafters)
        stats.skipped_drafters = dict(self.skipped_drafters)
        if req.grammar is not None:
            stats.num_masks, stats.mask_ms = req.grammar.num_masks, req.grammar.mask_ms
        req.result = Result(text=text, token_ids=req.generated, stats=stats, prompt_ids=req.prompt_ids)
        return text[req.emitted:]

    def steps(self, reqs: Sequence[_Request], prefills: Sequence[tuple[Backend, Sequence[int]]] = (),
              trees: bool = False) -> list[list[int] | None]:
        """One speculative step for each request, with one target forward for all of them:
        forced tokens -> plan -> draft -> verify -> commit. `prefills` (sequence, ids) ride in
        the same forward without logits (chunked prefill of joining requests).

        Returns per request the tokens to commit (the caller applies stop conditions), or None
        when nothing fits (context window or max_tokens). Advances the caches and grammars.
        """
        preps = [self._forced(req) for req in reqs]
        live = [i for i, p in enumerate(preps) if isinstance(p, _Prep)]
        out: list[list[int] | None] = [None if i in live else preps[i] for i in range(len(reqs))]  # type: ignore[misc]
        if not live and not prefills:
            return out
        # 2. Plan: which drafter and how many tokens each; one choice for the whole batch.
        t_plan = time.perf_counter()
        plans = _plan([reqs[i].policy for i in live], [preps[i].state for i in live],
                      sum(len(ids) for _, ids in prefills))
        plan_ms = 1000 * (time.perf_counter() - t_plan) / max(1, len(live))
        # 3. Draft (draft_ms counts planning too: free drafters propose inside plan()).
        for i, plan in zip(live, plans):
            t0 = time.perf_counter()
            self._draft(reqs[i], preps[i], plan, trees and len(live) == 1 and not prefills)
            preps[i].draft_ms = plan_ms + 1000 * (time.perf_counter() - t0)
        t_verify = time.perf_counter()
        if len(live) == 1 and isinstance(preps[live[0]].draft, TreeDraft):
            # 4'. Verify every branch in one target pass; keep the longest accepted one.
            req, prep = reqs[live[0]], preps[live[0]]
            branch_logits = req.slot.target.extend_tree(prep.context[-1], prep.draft.branches)  # [k_b+1, V] each
            branch, verdict = greedy_verify_tree(prep.draft.branches, [np.argmax(x, axis=-1) for x in branch_logits])
            req.slot.target.commit_branch(branch, verdict.num_accepted)
            out[live[0]] = self._commit(req, prep, verdict, prep.draft.branches[branch],
                                        1000 * (time.perf_counter() - t_verify), 0, 1)
            return out
        # 4. Verify: one target forward over, per request, [uncached committed tail, d_1..d_k]
        # with logits for its k+1 rows [last committed, d_1..d_k].
        items = [(reqs[i].slot.target, [*preps[i].context[reqs[i].slot.target.num_cached:],
                                        *preps[i].draft.token_ids], len(preps[i].draft) + 1) for i in live]
        items += [(seq, list(ids), 0) for seq, ids in prefills]
        logits = extend_batch(self.target, items)
        verify_ms = 1000 * (time.perf_counter() - t_verify)
        rows = self.last_rows = sum(len(ids) for _, ids, _ in items)
        batched = len(items) > 1
        if batched and self._target_time is not None:
            self._target_time.observe(rows, verify_ms)  # the shared forward, once at its total rows
        for i, row_logits in zip(live, logits):
            req, prep = reqs[i], preps[i]
            draft, grammar, sampling = prep.draft, req.grammar, req.sampling
            if grammar is not None:
                row_logits = masked(row_logits, grammar.masks(draft.token_ids))  # [k+1, V]
            if sampling.greedy:
                verdict = greedy_verify(draft.token_ids, np.argmax(row_logits, axis=-1))
            else:
                verdict = rejection_sample(draft, LazyTargetProbs(row_logits, sampling), req.rng)
            # 5. Commit: keep d_1..d_n in the cache, drop the rejected rest.
            req.slot.target.truncate(len(prep.context) + verdict.num_accepted)
            out[i] = self._commit(req, prep, verdict, draft.token_ids, verify_ms,
                                  rows if batched else 0, len(live) if batched else 1)
        return out

    def _forced(self, req: _Request) -> _Prep | list[int] | None:
        """1. Forced tokens: where the grammar allows a single token, its masked probability is 1,
        so it is committed with no decision; the target needs only its KV entry, which this
        step's forward writes (no logits row). Plain decoding (speculation off) decodes them
        one per forward like any other token. Returns what the step needs, or the request's
        last tokens when forced tokens end it (a list), or None when nothing fits."""
        target, grammar = req.slot.target, req.grammar
        remaining = req.sampling.max_tokens - len(req.generated)
        forced = []
        if grammar is not None and req.fast_forward:
            forced = grammar.forced(min(remaining, target.n_ctx - len(req.context)))
        req.stats.num_forced_tokens += len(forced)
        if forced and (forced[-1] in grammar.eos_token_ids or len(forced) >= remaining):
            return forced
        context = req.context + forced if forced else req.context
        # Never past the window or max_tokens.
        max_k = min(target.n_ctx - len(context), remaining - len(forced) - 1)
        if max_k < 0:
            return forced or None
        state = PlanState(context=context, max_k=max_k, greedy=req.sampling.greedy, grammar=grammar,
                          num_forced=len(forced))
        return _Prep(forced, context, max_k, state)

    def _draft(self, req: _Request, prep: _Prep, plan: Plan, trees: bool) -> None:
        draft = plan.draft
        if draft is None:
            draft = plan.drafter.propose(prep.context, plan.k, req.grammar) if plan.drafter is not None and plan.k > 0 else Draft()
        trees = trees and req.sampling.greedy and req.grammar is None and hasattr(req.slot.target, "extend_tree")
        draft = _fit(draft, prep.max_k, getattr(req.slot.target, "n_seq_max", 16) if trees else 1)
        if req.grammar is not None and len(draft):
            draft = draft.truncated(req.grammar.valid_prefix(draft.token_ids))
        prep.plan, prep.draft = plan, draft

    def _commit(self, req: _Request, prep: _Prep, verdict, draft_ids: Sequence[int], verify_ms: float,
                batch_rows: int, batch_size: int) -> list[int]:
        committed = verdict.committed(draft_ids)
        grammar, draft, plan = req.grammar, prep.draft, prep.plan
        if grammar is not None:
            grammar.consume([t for t in committed if t not in grammar.eos_token_ids])
        step = StepStats(
            drafter=draft.source if len(draft) else "none",
            num_drafted=len(draft), num_accepted=verdict.num_accepted,
            num_committed=len(committed) + len(prep.forced), draft_ms=prep.draft_ms,
            verify_ms=verify_ms, planned_k=plan.k,
            num_branches=len(draft.branches) if isinstance(draft, TreeDraft) else 1,
            num_forced=len(prep.forced), batch_rows=batch_rows, batch_size=batch_size,
        )
        req.stats.record(step)
        if plan.drafter is not None and len(draft):
            plan.drafter.accept(verdict.num_accepted)
        req.policy.observe(step)
        return prep.forced + committed


def _plan(policies: Sequence[Policy], states: Sequence[PlanState], extra_rows: int) -> list[Plan]:
    """Plans for one shared forward: auto policies of one engine choose jointly (batch-aware);
    any other policy plans its request alone."""
    from draftwise.policy_auto import AutoPolicy, plan_batch

    plans: list[Plan | None] = [None] * len(policies)
    auto = [i for i, p in enumerate(policies) if isinstance(p, AutoPolicy)]
    if auto and (len(auto) > 1 or extra_rows):
        for i, plan in zip(auto, plan_batch([policies[i] for i in auto], [states[i] for i in auto], extra_rows)):
            plans[i] = plan
    for i, (policy, state) in enumerate(zip(policies, states)):
        if plans[i] is None:
            plans[i] = policy.plan(state)
    return plans  # type: ignore[return-value]


@dataclass
class _Spec:
    """A validated request, not yet bound to a slot."""

    prompt_ids: list[int]
    sampling: SamplingParams
    speculation: SpeculationConfig
    cancelled: Callable[[], bool] | None
    drafters: tuple[str, ...] | None  # a subset by name; None: all
    grammar: Grammar | None


@dataclass
class _Slot:
    """A target sequence and the drafters that follow its requests (per-request state)."""

    index: int
    target: Backend
    drafters: list[Drafter]


@dataclass
class _Prep:
    """What a step carries from planning to commit for one request."""

    forced: list[int]
    context: list[int]  # committed + forced tokens
    max_k: int
    state: PlanState
    plan: Plan | None = None
    draft: Draft | TreeDraft = field(default_factory=Draft)
    draft_ms: float = 0.0


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
    slot: _Slot | None = None
    drafters: list[Drafter] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    decoder: _StreamDecoder | None = None
    stop_hold: int = 0
    eos_ids: frozenset[int] = frozenset()
    cancelled: Callable[[], bool] | None = None
    emitted: int = 0  # characters of text streamed so far
    stop_at: int | None = None
    t_decode: float = 0.0
    result: Result | None = None

    def push(self, new_ids: list[int] | None) -> str:
        """6. Stop conditions, token by token, for a step's tokens; returns the text now safe to
        stream (held back: a possible stop string's start, half a UTF-8 character)."""
        stats, sampling = self.stats, self.sampling
        if new_ids is None:
            stats.finish_reason = "length"
            return ""
        for token in new_ids:
            if token in self.eos_ids:
                stats.finish_reason = "stop"
                stats.num_eos = 1
                break
            self.generated.append(token)
            self.context.append(token)
            if len(self.generated) >= sampling.max_tokens:
                stats.finish_reason = "length"
                break
        decoder = self.decoder
        decoder.push(self.context[len(self.prompt_ids) + len(decoder.ids):])
        if sampling.stop:
            self.stop_at = _find_stop(decoder.text, sampling.stop, self.emitted - self.stop_hold)
            if self.stop_at is not None:
                stats.finish_reason = "stop"
        if stats.finish_reason:
            return ""
        ready = len(decoder.text) - self.stop_hold
        if ready <= self.emitted:
            return ""
        piece, self.emitted = decoder.text[self.emitted:ready], ready
        return piece

    def flush(self) -> str:
        """7. The whole text at the end: the last bytes flushed, cut at a stop string."""
        decoder, sampling = self.decoder, self.sampling
        if self.stop_at is None:
            decoder.flush()
            if sampling.stop:
                self.stop_at = _find_stop(decoder.text, sampling.stop, self.emitted - self.stop_hold)
        return decoder.text if self.stop_at is None else decoder.text[:self.stop_at]


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
