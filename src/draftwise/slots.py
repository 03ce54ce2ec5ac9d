"""The slot pool: the slots requests decode in, and what opens and closes a request in one.

A SlotPool owns the slots (made on first use), the set a Batcher is running requests in and
the lock that guards both with the caches, each slot's policies, the target-time model the
auto policies share, and start()/finish(). The Engine and every Batcher hold the same pool,
so the Batcher needs nothing of the Engine (docs/design.md section 2).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Protocol

from draftwise.backends.base import Backend, num_slots
from draftwise.drafters.base import Drafter
from draftwise.errors import ConfigError
from draftwise.metrics import RequestStats
from draftwise.policy import Policy, make_policy
from draftwise.policy.cost import MAX_K, TargetTime
from draftwise.request import Generation, Result, RunningRequest, Slot, StreamDecoder
from draftwise.sampling import make_rng


class HasSlotPool(Protocol):
    """What holds a pool (the Engine): a Batcher may be given it instead of the pool."""

    pool: SlotPool


class SlotPool:
    """The slots of one target. `lock` guards the caches and `busy` (reentrant: a stream()
    holds it across its Batcher's steps); claim/release change `busy` under it."""

    def __init__(
        self,
        target: Backend,
        drafters: list[Drafter],
        *,
        policy: Policy | None = None,
        skipped_drafters: dict[str, str] | None = None,
    ) -> None:
        """drafters and skipped_drafters are the engine's own (not copies): a drafter added to
        the engine serves the slots made after it."""
        self.target = target
        self.drafters = drafters
        self.skipped_drafters = {} if skipped_drafters is None else skipped_drafters
        self._policy_override = policy
        self._policies: dict[tuple[int, str, tuple[str, ...]], Policy] = {}
        self._slots: list[Slot] = []
        self._target_time: TargetTime | None = None  # made with the first auto policy
        self.busy: set[int] = set()  # slots a Batcher is running requests in
        self.lock = threading.RLock()

    # ------------------------------------------------------------------ the slots
    @property
    def num_slots(self) -> int:
        return num_slots(self.target)

    def open_slots(self) -> list[Slot]:
        """The slots created so far (slot(i) creates them on first use)."""
        return list(self._slots)

    def slot(self, index: int) -> Slot:
        """Slot `index`: a target sequence with drafters of its own (slot 0: the engine's)."""
        while len(self._slots) <= index:
            i = len(self._slots)
            if i >= self.num_slots:
                raise ConfigError(f"this engine has {self.num_slots} slot(s); load the target with more")
            if i == 0:
                self._slots.append(Slot(0, self.target, list(self.drafters)))
                continue
            drafters = [d.for_slot(i) for d in self.drafters]
            self._slots.append(Slot(i, self.target.sequence(i), drafters))
        return self._slots[index]

    def free_among(self, indices: Iterable[int]) -> set[int]:
        """Those of indices no Batcher is running a request in."""
        with self.lock:
            return set(indices) - self.busy

    def claim(self, index: int) -> None:
        with self.lock:
            self.busy.add(index)

    def release(self, index: int) -> None:
        with self.lock:
            self.busy.discard(index)

    # ------------------------------------------------------------------ the cost model
    def target_time(self) -> TargetTime:
        """The target's cost model shared by every auto policy of this pool (calibrated once)."""
        if self._target_time is None:
            self._target_time = TargetTime(self.target, max_n=MAX_K + 1)
        return self._target_time

    @property
    def shared_target_time(self) -> TargetTime | None:
        """The cost model if an auto policy made it (a batched forward's time is told to it)."""
        return self._target_time

    # ------------------------------------------------------------------ requests in slots
    def policy_for(self, slot: Slot, name: str, drafters: Sequence[str]) -> Policy:
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

    def start(self, generation: Generation, slot: Slot) -> RunningRequest:
        """Bind a generation's validated request to a slot: its drafters, policy and cache (not
        yet filled). Whether it is greedy, and may verify token trees, is decided here, once."""
        request = generation.request
        speculation, sampling = request.speculation, request.sampling
        names = request.drafters
        drafters = [d for d in slot.drafters if names is None or d.name in names] if speculation.enabled else []
        policy = self.policy_for(slot, speculation.policy, [d.name for d in drafters])
        greedy = sampling.greedy
        tokenizer = self.target.tokenizer
        req = RunningRequest(
            generation=generation,
            sampling=sampling,
            context=list(request.prompt_ids),
            rng=make_rng(sampling.seed),
            policy=policy,
            stats=RequestStats(num_prompt_tokens=len(request.prompt_ids)),
            slot=slot,
            decoder=StreamDecoder(tokenizer),
            greedy=greedy,
            grammar=request.grammar,
            trees=(
                greedy
                and request.grammar is None
                and speculation.max_branches > 1
                and slot.target.capabilities.max_branches > 1
            ),
            fast_forward=speculation.enabled,
            drafters=drafters,
            prompt_ids=list(request.prompt_ids),
            stop_hold=max((len(s) for s in sampling.stop), default=1) - 1,
            # A constrained answer ends when its grammar does, whatever ignore_eos says.
            eos_ids=tokenizer.eos_token_ids if not sampling.ignore_eos or request.grammar else frozenset(),
            cancelled=request.cancelled,
            t_decode=time.perf_counter(),
            trace=request.token_sources,
        )
        policy.begin(drafters, speculation)
        req.t_decode = time.perf_counter()  # the policy's set-up (a first calibration) is not decoding
        for drafter in drafters:
            drafter.begin(sampling, speculation, request.prompt_ids, tokenizer)
        return req

    def finish(self, req: RunningRequest) -> tuple[str, Result]:
        """Close a request: flush the last bytes, cut at a stop string; returns the text not yet
        streamed and the Result."""
        stats = req.stats
        if not stats.finish_reason:
            stats.finish_reason = "cancelled"
        text = req.flush()
        stats.decode_ms = 1000 * (time.perf_counter() - req.t_decode)
        stats.close_time_account()
        stats.num_generated = len(req.generated)
        stats.policy = req.policy.snapshot()
        stats.num_draft_reused_tokens = sum(d.num_reused_tokens for d in req.drafters)
        stats.skipped_drafters = dict(self.skipped_drafters)
        if req.grammar is not None:
            stats.num_masks, stats.mask_ms = req.grammar.num_masks, req.grammar.mask_ms
        if self._target_time is not None and stats.num_steps:
            # Plain decoding: a one-row forward per token, at the answer's middle context.
            middle = len(req.prompt_ids) + len(req.generated) // 2
            stats.estimated_plain_ms = (stats.num_generated + stats.num_eos) * self._target_time.ms(1, middle)
        result = Result(
            text=text,
            token_ids=req.generated,
            stats=stats,
            prompt_ids=req.prompt_ids,
            logprobs=None if req.sampling.logprobs is None else req.logprobs[: req.num_text_tokens()],
            prompt_logprobs=None if req.sampling.prompt_logprobs is None else req.prompt_logprobs,
            spans=req.all_spans(len(text)),
        )
        return text[req.emitted :], result
