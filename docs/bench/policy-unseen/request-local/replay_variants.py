"""Replay with the lookups' acceptance estimates carried from earlier requests as they are ("base")
or with part of that record shrunk at each request's start (the README's tables). Variants:
"all50" shrinks every bucket's hits and trials to half, "short50" and "short25" only the buckets
of match lengths below 16 (to half, to a quarter). Lookups free; `ngram` and `suffix`.

A SOURCE is a bench run's folder (its own answers at its own forwards' prices), or
SPLIT.jsonl:RUN (a corpus split's reference answers, edit/copy/fim, priced at RUN's forwards):

    python docs/bench/policy-unseen/request-local/replay_variants.py base,short50 \
        docs/bench/policy-unseen/rewrites/specbench-mini corpus/dev.jsonl:test-edit

The shrink is applied by wrapping AutoPolicy.begin in this script; the policy has no such option.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from draftwise import models
from draftwise.backends.base import text_marks
from draftwise.bench import account, prompts, replay
from draftwise.cli.replay import _sources
from draftwise.drafters.ngram import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.loading import LoadOptions, load_backend
from draftwise.policy import auto, estimates

BEGIN = auto.AutoPolicy.begin


def shrinking(factor: float, below: float | None) -> object:
    """AutoPolicy.begin, then every lookup estimate's buckets (below: of match lengths under it)
    keep `factor` of their hits and trials: the new request's own proposals weigh more."""
    per_table = len(estimates.COPY_BUCKETS)
    cut = per_table if below is None else estimates.copy_bucket(below)

    def begin(self, drafters, speculation) -> None:
        BEGIN(self, drafters, speculation)
        for est in self._copies.values():
            for i in range(len(est.hits)):
                if i % per_table < cut:
                    est.hits[i] *= factor
                    est.trials[i] *= factor
            est._rates = None

    return begin


VARIANTS = {"base": BEGIN, "all50": shrinking(0.5, None), "short50": shrinking(0.5, 16), "short25": shrinking(0.25, 16)}


def main(names: list[str], sources: list[str]) -> None:
    backend = load_backend(models.DEFAULT_TARGET, LoadOptions(n_ctx=256))
    tokenizer = backend.tokenizer
    marks = text_marks(tokenizer, backend.vocab_size)
    try:
        for source in sources:
            kinds: dict[int, str] = {}
            if ":" in source:
                split, run = source.split(":")
                results = json.loads((Path(run) / "results.json").read_text())
                pool = prompts.filter_categories(prompts.load_prompts(split), ["edit", "copy", "fim"])
                answers = replay.reference_answers(pool)
                kinds = {json.loads(line)["question_id"]: json.loads(line)["kind"] for line in open(split)}
            else:
                results, pool, answers = _sources(source, None)
            curve = replay.calibrated_curve(results)
            prices = account.run_prices(results, curve)
            runs = []
            for name in names:
                auto.AutoPolicy.begin = VARIANTS[name]
                sets = {name: [NgramDrafter(), SuffixDrafter()]}  # afresh: no suffix history carried over
                runs += replay.replay(
                    pool,
                    answers,
                    tokenizer,
                    sets,
                    curve,
                    count_lookups=False,
                    oracle=True,
                    line_ends=marks.line_ends,
                    fences=marks.fences,
                    prices=prices,
                )
            auto.AutoPolicy.begin = BEGIN
            totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
            for r in runs if kinds else ():
                t = totals[(kinds[r.question_id], r.drafters)]
                t[0], t[1], t[2] = t[0] + r.plain_ms, t[1] + r.ms, t[2] + r.oracle_ms
            for (kind, name), (plain, ms, oracle) in sorted(totals.items()):
                print(f"{source} {kind:15} {name:8} policy {plain / ms:.3f}x  optimum {plain / oracle:.3f}x")
            for category, by_set in replay.summarize(runs).items():
                cells = "  ".join(f"{n}: {s['speedup']:.3f}x/{s['oracle_speedup']:.3f}x" for n, s in by_set.items())
                print(f"{source} {category:17} {cells}")
    finally:
        backend.close()


if __name__ == "__main__":
    main(sys.argv[1].split(","), sys.argv[2:])
