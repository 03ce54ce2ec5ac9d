"""How near the hindsight optimum a policy gets that knows exactly how long the lookups' copies
hold, by match length and line start, but not where each one breaks (the README's "bound").

For every position of each edit's reference answer, the `ngram` and `suffix` lookups propose up
to 64 tokens and the number they get right is known (as for the optimum, bench.offline.replay's
oracle_schedule). The survival S_f(j) = P(at least j tokens right | f) is counted in hindsight
per feature f = (the ngram proposal's match-length bucket, whether its first token starts a
line): over the whole split ("pooled") or over each answer alone ("own": as if the policy knew
every answer's own statistics from its first token). The simulated policy drafts, at each step,
the k that maximises (1 + S_f(1) + ... + S_f(k)) / cost(k + 1), plain decoding included; the
optimum is the cheapest schedule of the same proposals (bench.offline.replay.cheapest_schedule, the
oracle's own). Both priced on the cost curve.

    python docs/bench/policy-unseen/zen4/survival_bound.py corpus/dev.jsonl test-edit/results.json
    python docs/bench/policy-unseen/zen4/survival_bound.py corpus/dev.jsonl test-edit/results.json fim

A third argument picks the category (edit, the default; fim: each prompt built as /infill builds
it, the reference middle as the answer; copy).
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from draftwise import models
from draftwise.backends.base import common_prefix_length, encode_chat, text_marks
from draftwise.bench.offline import replay
from draftwise.bench.suites import prompts
from draftwise.bench.suites.fim import fim_ids
from draftwise.drafters.ngram import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.loading import LoadOptions, load_backend
from draftwise.policy.cost import MAX_K
from draftwise.policy.estimates import copy_bucket
from draftwise.types import SamplingParams, SpeculationConfig


def positions(tokenizer, line_ends, prompt_ids, answer_ids):
    """Per answer position: the most tokens a lookup's proposal gets right, and its feature."""
    ngram, suffix = NgramDrafter(), SuffixDrafter()
    for d in (ngram, suffix):
        d.begin(SamplingParams(), SpeculationConfig(), prompt_ids, tokenizer)
    n = len(answer_ids)
    correct, features = [0] * n, [(-1, False)] * n
    for pos in range(n - 1):
        context = prompt_ids + answer_ids[:pos]
        limit = min(MAX_K, n - pos - 1)
        draft = ngram.propose(context, limit)
        other = suffix.propose(context, limit)
        correct[pos] = max(
            common_prefix_length(draft.token_ids[:limit], answer_ids[pos:]),
            common_prefix_length(other.token_ids[:limit], answer_ids[pos:]),
        )
        features[pos] = (copy_bucket(draft.score) if len(draft) else -1, context[-1] in line_ends)
    return correct, features


def survival(answers) -> dict:
    """feature -> [P(at least j right) for j = 0..MAX_K]."""
    hits: dict = defaultdict(lambda: [0] * (MAX_K + 1))
    total: dict = defaultdict(int)
    for _, _, correct, features in answers:
        for right, f in zip(correct, features):
            total[f] += 1
            for j in range(1, right + 1):
                hits[f][j] += 1
    return {f: [h / total[f] for h in hits[f]] for f in total}


def simulate(curve, prompt_len, correct, features, surv) -> float:
    n, pos, ms = len(correct), 0, 0.0
    while pos < n:
        context = prompt_len + pos
        f = features[pos]
        best_k, best_rate = 0, 1.0 / curve.ms(1, context)
        if f[0] >= 0:
            expected = 1.0
            for k in range(1, min(MAX_K, n - pos - 1) + 1):
                expected += surv[f][k]
                rate = expected / curve.ms(k + 1, context)
                if rate > best_rate:
                    best_k, best_rate = k, rate
        ms += curve.ms(best_k + 1, context)
        pos += min(best_k, correct[pos]) + 1
    return ms


def main(split: str, curve_path: str, category: str = "edit") -> None:
    backend = load_backend(models.DEFAULT_TARGET, LoadOptions(n_ctx=256))
    tokenizer = backend.tokenizer
    line_ends = text_marks(tokenizer, backend.vocab_size).line_ends
    curve = replay.calibrated_curve(json.loads(Path(curve_path).read_text()))
    pool = prompts.filter_categories(prompts.load_prompts(split), [category])
    references = replay.reference_answers(pool)
    kinds = {r["question_id"]: r["kind"] for r in map(json.loads, open(split))}
    answers = []
    try:
        for prompt in pool:
            text = references.get((prompt.question_id, 0))
            if not text:
                continue
            if prompt.suffix is not None:
                prompt_ids = fim_ids(tokenizer, prompt)
            else:
                prompt_ids = encode_chat(tokenizer, [{"role": "user", "content": prompt.turns[0]}])
            answer_ids = tokenizer.encode(text, add_special=False)
            found = positions(tokenizer, line_ends, prompt_ids, answer_ids)
            answers.append((prompt.question_id, len(prompt_ids), *found))
    finally:
        backend.close()
    pooled = survival(answers)
    for mode in ("pooled", "own"):
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        logs = [0.0, 0.0]
        for answer in answers:
            qid, prompt_len, correct, features = answer
            surv = pooled if mode == "pooled" else survival([answer])
            plain = sum(curve.ms(1, prompt_len + i) for i in range(len(correct)))
            ms = simulate(curve, prompt_len, correct, features, surv)
            best = replay.cheapest_schedule(correct, prompt_len, curve)[0][0]
            for key in (kinds[qid], "all"):
                t = totals[key]
                t[0], t[1], t[2] = t[0] + plain, t[1] + ms, t[2] + best
            logs[0] += math.log(plain / ms)
            logs[1] += math.log(plain / best)
        m = len(answers)
        print(f"{mode}: geometric mean {math.exp(logs[0] / m):.3f}x of an optimum of {math.exp(logs[1] / m):.3f}x")
        for key, (plain, ms, best) in sorted(totals.items()):
            print(f"  {key:15} {plain / ms:.3f}x  optimum {plain / best:.3f}x  {best / ms:.1%}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
