#!/usr/bin/env python
"""Logprobs under speculation against plain decoding on llama.cpp: how far apart they are.

Each prompt is answered greedily twice with `logprobs` (the chosen token's and the top 5): plain
decoding (a row per forward) and speculative decoding (fixed policy, n-gram drafts of --k tokens,
so most tokens come from verification batches). Over the tokens both answers share (up to where
they first differ), prints the absolute differences of the chosen tokens' logprobs: max, median,
p99 and how many tokens came from a batch of several rows. On the toy and transformers float32
backends the two are equal (tests/server/test_choices.py); on llama.cpp a batch of several rows
rounds differently from a one-row step (README, "What is exact"), and this measures by how much.

    python scripts/measure_logprob_drift.py [--target M] [--max-tokens 128] [--k 4] [--prompts N]
"""

from __future__ import annotations

import argparse
import json
import statistics

from draftwise import models
from draftwise.bench.suites.prompts import load_suite
from draftwise.loading import load_engine
from draftwise.types import SamplingParams, SpeculationConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=models.DEFAULT_TARGET)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=6, help="From the code_edit suite (copy-heavy: drafts land).")
    args = parser.parse_args()
    engine = load_engine(args.target, "ngram", speculation=SpeculationConfig(policy="fixed"))
    sampling = SamplingParams(max_tokens=args.max_tokens, logprobs=5)
    plain_cfg = SpeculationConfig(enabled=False)
    spec_cfg = SpeculationConfig(policy="fixed", max_draft_tokens=args.k)
    diffs: list[float] = []
    top_diffs: list[float] = []
    for prompt in load_suite("code_edit")[: args.prompts]:
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
        print(
            json.dumps(
                {
                    "question_id": prompt.question_id,
                    "tokens": len(plain.token_ids),
                    "shared": shared,
                    "accepted": spec.stats.num_accepted,
                    "max_abs_diff": max(mine, default=0.0),
                    "median_abs_diff": statistics.median(mine) if mine else 0.0,
                }
            ),
            flush=True,
        )
    diffs.sort()
    print(
        json.dumps(
            {
                "tokens_compared": len(diffs),
                "max_abs_diff": diffs[-1] if diffs else 0.0,
                "median_abs_diff": statistics.median(diffs) if diffs else 0.0,
                "p99_abs_diff": diffs[int(0.99 * (len(diffs) - 1))] if diffs else 0.0,
                "top5_alternatives_max_abs_diff": max(top_diffs, default=0.0),
                "equal_to_1e-5": sum(d <= 1e-5 for d in diffs),
            }
        )
    )


if __name__ == "__main__":
    main()
