"""Replay a corpus split's reference answers with `ngram`'s rewrites off and on (the README's split
tables): per edit kind and category, plain decoding's total time over the policy's and over the
hindsight optimum's, and each category's geometric means; lookups free, priced at a bench run's
forwards (`bench.offline.account.run_prices`).

    python docs/bench/policy-unseen/rewrites/replay_splits.py corpus/dev.jsonl test-edit/results.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from draftwise import models
from draftwise.backends.base import text_marks
from draftwise.bench.offline import account, replay
from draftwise.bench.suites import prompts
from draftwise.drafters.ngram import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.loading import LoadOptions, load_backend


def main(split: str, run: str) -> None:
    results = json.loads(Path(run).read_text())
    curve = replay.calibrated_curve(results)
    prices = account.run_prices(results, curve)
    kinds = {json.loads(line)["question_id"]: json.loads(line)["kind"] for line in open(split)}
    chosen = prompts.filter_categories(prompts.load_prompts(split), ["edit", "copy", "fim"])
    backend = load_backend(models.DEFAULT_TARGET, LoadOptions(n_ctx=256))
    try:
        marks = text_marks(backend.tokenizer, backend.vocab_size)
        sets = {  # built afresh: the suffix drafter's history must not carry over from another replay
            "without": [NgramDrafter(rewrites=False), SuffixDrafter()],
            "with": [NgramDrafter(), SuffixDrafter()],
        }
        runs = replay.replay(
            chosen,
            replay.reference_answers(chosen),
            backend.tokenizer,
            sets,
            curve,
            count_lookups=False,
            oracle=True,
            line_ends=marks.line_ends,
            fences=marks.fences,
            prices=prices,
        )
    finally:
        backend.close()
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for r in runs:
        t = totals[(kinds[r.question_id], r.drafters)]
        t[0], t[1], t[2] = t[0] + r.plain_ms, t[1] + r.ms, t[2] + r.oracle_ms
    for (kind, name), (plain, ms, oracle) in sorted(totals.items()):
        print(f"{kind:15} {name:8} policy {plain / ms:.3f}x  optimum {plain / oracle:.3f}x")
    for category, by_set in replay.summarize(runs).items():
        for name, s in by_set.items():
            print(f"{category:15} {name:8} geometric mean {s['speedup']:.3f}x  optimum {s['oracle_speedup']:.3f}x")


if __name__ == "__main__":
    main(*sys.argv[1:3])
