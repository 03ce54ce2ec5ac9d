"""SmolLM2-135M-Instruct drafting for the default target across vocabularies (drafters/crossvocab.py).

Fixed policy, for each prompt mode, drafting level (token: TLI; string: the draft's own text
re-encoded, drafters/stringlevel.py), temperature (0: greedy; else seeded samples) and k:
acceptance per drafted token (its 95% interval by bootstrap over prompts), the conditional
acceptance at draft positions 1..k, tokens per target forward, and wall time against plain
decoding of the same prompts (greedy; indicative only on a shared host). Then the draft's forward
of one token against the target's, interleaved, medians.

    python scripts/measure_crossvocab.py --per-suite 2 --max-tokens 96
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from draftwise import models
from draftwise.bench.suites.prompts import load_suite
from draftwise.loading import LoadOptions, load_engine
from draftwise.types import SamplingParams, SpeculationConfig


def bootstrap(accepted: list[int], drafted: list[int], rounds: int = 2000) -> tuple[float, float]:
    """95% interval of sum(accepted) / sum(drafted), prompts resampled with replacement."""
    rng = np.random.default_rng(0)
    a, d = np.asarray(accepted), np.asarray(drafted)
    picks = rng.integers(0, len(a), size=(rounds, len(a)))
    ratios = a[picks].sum(axis=1) / np.maximum(1, d[picks].sum(axis=1))
    return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def forward_ms(backend, prefix: list[int], token: int, repeats: int) -> list[float]:
    times = []
    backend.reset()
    backend.prefill(prefix)
    for _ in range(repeats):
        t0 = time.perf_counter()
        backend.extend([token])
        times.append(1000 * (time.perf_counter() - t0))
        backend.truncate(len(prefix))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default="chat,rag,math")
    parser.add_argument("--per-suite", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--ks", default="2,3,4,5")
    parser.add_argument("--modes", default="template,plain")
    parser.add_argument("--levels", default="token,string")
    parser.add_argument("--temperatures", default="0")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    engine = load_engine(
        models.DEFAULT_TARGET,
        models.SMOLLM2,
        options=LoadOptions(n_ctx=4096, threads=args.threads),
        speculation=SpeculationConfig(policy="fixed"),
    )
    drafter = engine.drafters[0]
    prompts = [(s, p) for s in args.suites.split(",") for p in load_suite(s)[: args.per_suite]]
    sampling = SamplingParams(max_tokens=args.max_tokens)
    print(
        f"{len(prompts)} prompts ({args.suites}), {args.max_tokens} tokens; shared vocabulary "
        f"{drafter.vocab.num_shared} of {drafter.vocab.num_draft_tokens} draft tokens"
    )
    ids = [engine.encode_prompt(messages=[{"role": "user", "content": p.turns[0]}]) for _, p in prompts]
    plain_s = []
    for prompt_ids in ids:
        result = engine.generate(prompt_ids=prompt_ids, sampling=sampling, speculation=SpeculationConfig(enabled=False))
        plain_s.append(result.stats.decode_ms / 1000)
    print(f"plain: {sum(plain_s):.1f} s decoding")
    print(
        "mode      level  temp k  accepted/drafted  per token [95%]      by position            "
        "tokens/forward  draft ms/tok  decode vs plain"
    )
    runs = [
        (mode, level, float(t), int(k))
        for mode in args.modes.split(",")
        for level in args.levels.split(",")
        for t in args.temperatures.split(",")
        for k in args.ks.split(",")
    ]
    for mode, level, temperature, k in runs:
        drafter.prompt_mode, drafter.draft_level = mode, level
        spec = SpeculationConfig(policy="fixed", max_draft_tokens=k)
        sampled = SamplingParams(max_tokens=args.max_tokens, temperature=temperature, seed=0)
        acc, dra, gen, steps, secs, draft_ms = [], [], 0, 0, 0.0, 0.0
        pos_d, pos_a = np.zeros(k), np.zeros(k)
        for prompt_ids in ids:
            r = engine.generate(prompt_ids=prompt_ids, sampling=sampled, speculation=spec, drafters=["draft"])
            s = r.stats
            acc.append(s.num_accepted)
            dra.append(s.num_drafted)
            gen, steps = gen + s.num_generated, steps + s.num_steps
            secs, draft_ms = secs + s.decode_ms / 1000, draft_ms + s.draft_ms
            pos_d[: len(s.position_drafted)] += s.position_drafted[:k]
            pos_a[: len(s.position_accepted)] += s.position_accepted[:k]
        low, high = bootstrap(acc, dra)
        by_pos = " ".join(f"{a / max(1, d):.2f}" for a, d in zip(pos_a, pos_d))
        print(
            f"{mode:9} {level:6} {temperature:4.1f} {k}  {sum(acc):5d}/{sum(dra):5d}       "
            f"{sum(acc) / max(1, sum(dra)):.3f} "
            f"[{low:.3f}, {high:.3f}]  {by_pos:22} {gen / max(1, steps):.2f}            "
            f"{draft_ms / max(1, sum(dra)):.1f}          {sum(plain_s) / secs:.2f}x"
        )
    # One token's forward, draft against target, interleaved so that both see the same load.
    prefix = ids[0]
    draft_prefix = drafter.backend.tokenizer.encode(engine.tokenizer.decode(prefix))
    target_ms, draft_ms = [], []
    for _ in range(5):
        target_ms += forward_ms(engine.target, prefix, prefix[-1], 4)
        draft_ms += forward_ms(drafter.backend, draft_prefix, draft_prefix[-1], 4)
    t, d = statistics.median(target_ms), statistics.median(draft_ms)
    print(
        f"one-token forward: target {t:.1f} ms, draft {d:.1f} ms (medians of 20): a draft token costs {d / t:.1%} "
        "of a target step"
    )


if __name__ == "__main__":
    main()
