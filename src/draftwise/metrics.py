"""Per-request counters and the derived rates of docs/design.md section 5 (names are fixed).

num_drafted / num_accepted (draft tokens; the bonus or correction token is excluded),
num_steps (target forwards after the prompt), acceptance_rate, mean_accepted_tokens,
tokens_per_step (tau), accepted_per_position[i], tokens_per_second (decode, prefill
excluded) and tokens_per_second_e2e (prefill included).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from draftwise.types import StepStats


@dataclass
class RequestStats:
    num_prompt_tokens: int = 0
    num_reused_tokens: int = 0  # prompt tokens whose KV entries were reused from the last request
    num_draft_reused_tokens: int = 0  # the same for the draft model's cache (0 if it never drafted)
    num_generated: int = 0
    num_eos: int = 0  # 1 when an EOS token ended the request (committed, not part of the text)
    num_drafted: int = 0
    num_accepted: int = 0
    num_steps: int = 0
    num_steps_with_draft: int = 0
    num_tree_steps: int = 0  # steps that verified several branches at once
    # Structured output: tokens the grammar forced (the only one allowed: committed with no
    # decision, no logits row), steps whose forward carried only such tokens besides the last
    # committed one, and the grammar masks computed and their time.
    num_forced_tokens: int = 0
    num_forced_steps: int = 0
    num_masks: int = 0
    mask_ms: float = 0.0
    plain_step_ms: float = 0.0  # target time of the steps that drafted nothing: the machine's speed
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    finish_reason: str = ""
    position_drafted: list[int] = field(default_factory=list)  # drafts that reached position i
    position_accepted: list[int] = field(default_factory=list)  # ... and had it accepted
    drafter_choices: Counter = field(default_factory=Counter)  # drafter name -> steps
    k_choices: Counter = field(default_factory=Counter)  # planned k -> steps
    drafted_by: Counter = field(default_factory=Counter)  # drafter name -> draft tokens verified
    accepted_by: Counter = field(default_factory=Counter)  # drafter name -> draft tokens accepted
    # Generated tokens by where they came from: "target" (its own: plain steps, corrections,
    # bonus tokens), "grammar" (forced), or the drafter whose draft token was accepted.
    tokens_by_source: Counter = field(default_factory=Counter)
    # What plain decoding would have spent on the target's forwards for this answer, from the
    # calibrated cost curve (0: no curve); estimated_speedup is it over decode_ms.
    estimated_plain_ms: float = 0.0
    # The time account of the decode: milliseconds per step phase (force, plan, draft, forward,
    # masks, verify, commit; a batched step's shared phases count for every request in it), the
    # loop around the step ("loop": bookkeeping, stop strings, detokenising) and "other", the
    # rest of decode_ms (between steps: the caller). They sum to decode_ms.
    time_ms: dict = field(default_factory=dict)
    # Per step: (target rows in its forward, context length, forward ms, step ms incl. the loop);
    # `draftwise replay` prices the same steps on the calibrated curve beside these.
    step_times: list = field(default_factory=list)
    # Per step: (tokens committed, draft tokens verified, draft tokens accepted), in output order:
    # acceptance over the output (bench.record.timing.acceptance_windows) comes from these.
    step_tokens: list = field(default_factory=list)
    policy: dict = field(default_factory=dict)  # the policy's final estimates
    skipped_drafters: dict = field(default_factory=dict)  # drafter -> why it was not loaded

    def record_time(self, phase_ms: dict[str, float], step_ms: float, rows: int, context: int) -> None:
        """Add one step's phases to the time account; step_ms is the loop's whole step."""
        for phase, ms in phase_ms.items():
            self.time_ms[phase] = self.time_ms.get(phase, 0.0) + ms
        self.time_ms["loop"] = self.time_ms.get("loop", 0.0) + step_ms - sum(phase_ms.values())
        self.step_times.append((rows, context, round(phase_ms.get("forward", 0.0), 3), round(step_ms, 3)))

    def close_time_account(self) -> None:
        """The rest of decode_ms, outside the steps (call once decode_ms is final)."""
        self.time_ms["other"] = self.decode_ms - sum(v for k, v in self.time_ms.items() if k != "other")

    def record(self, step: StepStats) -> None:
        self.num_steps += 1
        self.step_tokens.append((step.num_committed, step.num_drafted, step.num_accepted))
        self.num_drafted += step.num_drafted
        self.num_accepted += step.num_accepted
        self.draft_ms += step.draft_ms
        self.verify_ms += step.verify_ms
        self.drafter_choices[step.drafter] += 1
        if step.num_drafted:
            self.drafted_by[step.drafter] += step.num_drafted
            self.accepted_by[step.drafter] += step.num_accepted
        self.k_choices[step.planned_k] += 1
        self.num_tree_steps += int(step.num_branches > 1)
        if not step.num_drafted:
            if step.num_forced:
                self.num_forced_steps += 1
            else:
                self.plain_step_ms += step.verify_ms
        else:
            self.num_steps_with_draft += 1
            while len(self.position_drafted) < step.num_drafted:
                self.position_drafted.append(0)
                self.position_accepted.append(0)
            for i in range(step.num_drafted):
                self.position_drafted[i] += 1
                self.position_accepted[i] += int(i < step.num_accepted)

    @property
    def num_plain_steps(self) -> int:
        """Steps that drafted nothing (and carried no forced tokens): one target row each."""
        return self.num_steps - self.num_steps_with_draft - self.num_forced_steps

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        return self.num_accepted / self.num_steps_with_draft if self.num_steps_with_draft else 0.0

    @property
    def tokens_per_step(self) -> float:
        # The EOS token is produced by a step like any other, so plain decoding stays at 1.0.
        return (self.num_generated + self.num_eos) / self.num_steps if self.num_steps else 0.0

    @property
    def accepted_per_position(self) -> list[float]:
        return [a / d for a, d in zip(self.position_accepted, self.position_drafted)]

    @property
    def estimated_speedup(self) -> float:
        return self.estimated_plain_ms / self.decode_ms if self.estimated_plain_ms and self.decode_ms > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        return 1000.0 * self.num_generated / self.decode_ms if self.decode_ms > 0 else 0.0

    @property
    def tokens_per_second_e2e(self) -> float:
        total = self.decode_ms + self.prefill_ms
        return 1000.0 * self.num_generated / total if total > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_reused_tokens": self.num_reused_tokens,
            "num_draft_reused_tokens": self.num_draft_reused_tokens,
            "num_generated": self.num_generated,
            "num_eos": self.num_eos,
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "num_steps": self.num_steps,
            "num_steps_with_draft": self.num_steps_with_draft,
            "num_tree_steps": self.num_tree_steps,
            "num_plain_steps": self.num_plain_steps,
            "plain_step_ms": self.plain_step_ms,
            "num_forced_tokens": self.num_forced_tokens,
            "num_forced_steps": self.num_forced_steps,
            "num_masks": self.num_masks,
            "mask_ms": self.mask_ms,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_tokens": self.mean_accepted_tokens,
            "tokens_per_step": self.tokens_per_step,
            "accepted_per_position": self.accepted_per_position,
            "position_drafted": list(self.position_drafted),
            "position_accepted": list(self.position_accepted),
            "tokens_per_second": self.tokens_per_second,
            "tokens_per_second_e2e": self.tokens_per_second_e2e,
            "prefill_ms": self.prefill_ms,
            "decode_ms": self.decode_ms,
            "draft_ms": self.draft_ms,
            "verify_ms": self.verify_ms,
            "finish_reason": self.finish_reason,
            "drafter_choices": dict(self.drafter_choices),
            "drafted_by_drafter": dict(self.drafted_by),
            "accepted_by_drafter": dict(self.accepted_by),
            "tokens_by_source": dict(self.tokens_by_source),
            "estimated_plain_ms": round(self.estimated_plain_ms, 3),
            "estimated_speedup": round(self.estimated_speedup, 3),
            "k_choices": {str(k): v for k, v in sorted(self.k_choices.items())},
            "time_ms": {k: round(v, 3) for k, v in self.time_ms.items()},
            "step_times": [list(t) for t in self.step_times],
            "step_tokens": [list(t) for t in self.step_tokens],
            "policy": self.policy,
            "skipped_drafters": self.skipped_drafters,
        }
