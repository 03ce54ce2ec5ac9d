"""Logprobs under speculation against plain decoding on llama.cpp: how far apart they are.

Each prompt of the code_edit suite (copy-heavy: drafts land) is answered greedily twice with
`logprobs` (the chosen token's and the top 5): plain decoding (a row per forward) and speculative
decoding (fixed policy, n-gram drafts of `k` tokens, so most tokens come from verification
batches). Over the tokens both answers share (up to where they first differ), the absolute
differences of the chosen tokens' logprobs: max, median, p99, and the top-5 alternatives' max. On
the toy and transformers float32 backends the two are equal (tests/server/test_choices.py); on
llama.cpp a batch of several rows rounds differently from a one-row step (README, "What is
exact"), and this measures by how much (docs/exactness.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from draftwise.bench.suites.prompts import load_suite
from draftwise.types import SamplingParams, SpeculationConfig


@dataclass(frozen=True)
class PromptDrift:
    question_id: int
    tokens: int
    shared: int  # tokens before the two answers first differ
    accepted: int  # draft tokens the speculative answer accepted
    max_abs_diff: float
    median_abs_diff: float


@dataclass(frozen=True)
class LogprobDrift:
    prompts: tuple[PromptDrift, ...]
    tokens_compared: int
    max_abs_diff: float
    median_abs_diff: float
    p99_abs_diff: float
    top5_alternatives_max_abs_diff: float
    equal_to_1e_5: int  # compared tokens whose logprobs differ by 1e-5 or less


def measure(
    target: str,
    max_tokens: int = 128,
    k: int = 4,
    num_prompts: int = 6,
    on_prompt: Callable[[PromptDrift], None] | None = None,
) -> LogprobDrift:
    """The drift over the first `num_prompts` code_edit prompts; `on_prompt` after each."""
    from draftwise.loading import load_engine

    if num_prompts < 1 or max_tokens < 1 or k < 1:
        raise ValueError(f"num_prompts, max_tokens and k must be at least 1, got {num_prompts}, {max_tokens}, {k}")
    engine = load_engine(target, "ngram", speculation=SpeculationConfig(policy="fixed"))
    try:
        sampling = SamplingParams(max_tokens=max_tokens, logprobs=5)
        plain_cfg = SpeculationConfig(enabled=False)
        spec_cfg = SpeculationConfig(policy="fixed", max_draft_tokens=k)
        diffs: list[float] = []
        top_diffs: list[float] = []
        per_prompt = []
        for prompt in load_suite("code_edit")[:num_prompts]:
            messages = [{"role": "user", "content": prompt.turns[0]}]
            plain = engine.generate(messages=messages, sampling=sampling, speculation=plain_cfg)
            spec = engine.generate(messages=messages, sampling=sampling, speculation=spec_cfg)
            shared = next(
                (i for i, (a, b) in enumerate(zip(plain.token_ids, spec.token_ids)) if a != b),
                min(len(plain.token_ids), len(spec.token_ids)),
            )
            mine = [abs(a.logprob - b.logprob) for a, b in zip(plain.logprobs[:shared], spec.logprobs[:shared])]
            for a, b in zip(plain.logprobs[:shared], spec.logprobs[:shared]):
                ours = dict(b.top)
                top_diffs += [abs(lp - ours[t]) for t, lp in a.top if t in ours]
            diffs += mine
            one = PromptDrift(
                question_id=prompt.question_id,
                tokens=len(plain.token_ids),
                shared=shared,
                accepted=spec.stats.num_accepted,
                max_abs_diff=max(mine, default=0.0),
                median_abs_diff=statistics.median(mine) if mine else 0.0,
            )
            per_prompt.append(one)
            if on_prompt is not None:
                on_prompt(one)
    finally:
        engine.close()
    diffs.sort()
    return LogprobDrift(
        prompts=tuple(per_prompt),
        tokens_compared=len(diffs),
        max_abs_diff=diffs[-1] if diffs else 0.0,
        median_abs_diff=statistics.median(diffs) if diffs else 0.0,
        p99_abs_diff=diffs[int(0.99 * (len(diffs) - 1))] if diffs else 0.0,
        top5_alternatives_max_abs_diff=max(top_diffs, default=0.0),
        equal_to_1e_5=sum(d <= 1e-5 for d in diffs),
    )
