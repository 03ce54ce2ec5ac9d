"""Does the target's own confidence say where a copy breaks? For a corpus split's first edits,
the target's distribution at every position of the reference answer (one pass over prompt and
answer), and where the lookups' copies break (replay.oracle_schedule's `correct`: the longest
right proposal at each position). A copy is long at position q when a proposal made 16+ tokens
earlier is right up to q - 1; it breaks at q when its token q is wrong. Printed: how often a long
copy breaks at q, and within q..q+15, by the entropy of the target's distribution at q - 1 (the
last row a policy has seen when it plans a draft from q: the bonus token's) and at q itself (the
break's own row, which no plan can see), and within q..q+15 by the highest entropy of the 16 rows
before q (all of them seen when a draft from q is planned).

    python docs/bench/policy-unseen/lookahead/target_confidence.py corpus/dev.jsonl 30
"""

from __future__ import annotations

import sys

import numpy as np

from draftwise import models
from draftwise.backends.base import encode_chat
from draftwise.bench.offline import replay
from draftwise.bench.suites import prompts
from draftwise.calibrate import CostCurve
from draftwise.drafters.ngram import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.loading import LoadOptions, load_backend
from draftwise.types import SpeculationConfig

LONG, WITHIN, CHUNK = 16, 16, 256
BUCKETS = (0.0, 0.01, 0.05, 0.2, 0.5, 1.0, 2.0)  # nats


def entropies(backend, prompt_ids: list[int], answer_ids: list[int]) -> np.ndarray:
    """H of the target's distribution for each answer token (row q: the context before q)."""
    backend.reset()
    backend.prefill(prompt_ids[:-1])
    feed = [prompt_ids[-1], *answer_ids[:-1]]
    out = []
    for i in range(0, len(feed), CHUNK):
        logits = backend.extend(feed[i : i + CHUNK]).astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        out.append(-(p * np.log(np.maximum(p, 1e-30))).sum(axis=1))
    return np.concatenate(out)


def long_copy_breaks(correct) -> list[tuple[int, bool]]:
    """(q, breaks at q) for every q where a copy that held LONG+ tokens is still going."""
    n, reach, out = len(correct), -1, []
    for q in range(LONG, n):
        s = q - LONG
        reach = max(reach, s + correct[s])
        if reach >= q:
            out.append((q, reach == q))
    return out


def bucket(h: float) -> int:
    return max(i for i, b in enumerate(BUCKETS) if h >= b)


def main(split: str, count: int, keep: str = "") -> None:
    backend = load_backend(models.DEFAULT_TARGET, LoadOptions(n_ctx=32768))
    tokenizer = backend.tokenizer
    pool = [p for p in prompts.load_prompts(split) if p.category == "edit"][:count]
    answers = replay.reference_answers(pool)
    flat = CostCurve(((1, 1.0), (65, 65.0)))  # the schedule's price is not used here, only `correct`
    # by bucket of H(q - 1) and of H(q): [positions, breaks at q, breaks within WITHIN]
    before = np.zeros((len(BUCKETS), 3))
    at = np.zeros((len(BUCKETS), 2))
    recent = np.zeros((len(BUCKETS), 2))
    kept: dict[str, np.ndarray] = {}
    for prompt in pool:
        prompt_ids = encode_chat(tokenizer, [{"role": "user", "content": prompt.turns[0]}])
        answer_ids = tokenizer.encode(answers[(prompt.question_id, 0)], add_special=False)
        schedule = replay.oracle_schedule(
            [NgramDrafter(), SuffixDrafter()],
            SpeculationConfig(),
            prompt_ids,
            answer_ids,
            flat,
            64,
            tokenizer=tokenizer,
        )
        h = entropies(backend, prompt_ids, answer_ids)
        kept[str(prompt.question_id)] = h.astype(np.float32)
        events = long_copy_breaks(schedule.positions.correct)
        broke = {q for q, b in events if b}
        for q, b in events:
            row = before[bucket(h[q - 1])]
            row[0] += 1
            row[1] += b
            at[bucket(h[q])] += (1, b)
            soon = any(q + i in broke for i in range(WITHIN))
            row[2] += soon
            recent[bucket(h[q - LONG : q].max())] += (1, soon)
        print(f"{prompt.question_id}: {len(answer_ids)} tokens, {len(events)} in long copies, {len(broke)} breaks")
    backend.close()
    if keep:
        np.savez_compressed(keep, **kept)
    print(f"\nH(q-1) nats | positions | share | breaks at q | rate | breaks in q..q+{WITHIN - 1} | rate")
    for i, (n, b, w) in enumerate(before):
        if n:
            share = n / before[:, 0].sum()
            print(f"{BUCKETS[i]:>5}+ | {n:.0f} | {share:.3f} | {b:.0f} | {b / n:.4f} | {w:.0f} | {w / n:.3f}")
    print(f"\nmax H(q-{LONG}..q-1) nats | positions | breaks in q..q+{WITHIN - 1} | rate")
    for i, (n, w) in enumerate(recent):
        if n:
            print(f"{BUCKETS[i]:>5}+ | {n:.0f} | {w:.0f} | {w / n:.3f}")
    print("\nH(q) nats (the break's own row) | positions | breaks at q | rate")
    for i, (n, b) in enumerate(at):
        if n:
            print(f"{BUCKETS[i]:>5}+ | {n:.0f} | {b:.0f} | {b / n:.4f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:4])
