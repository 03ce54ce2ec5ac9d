"""Replay what one request leaves to the next (the lookups' acceptance record, the suffix
drafter's history) under the policy as it is ("kind") and variants of it, and print speed per
category: a server's requests of one kind after another kind's, and the shipped runs in their own
order. Variants:

- "base": one record for every request, as before RECORD_KINDS (policy/estimates.py);
- "kind": the policy as it is: matches shorter than KIND_BELOW (16) recorded per kind of prompt
  (lines, prose), longer ones in one record;
- "kind-all", "kind8": every match length recorded per kind; below 8 only.

A SOURCE is a bench run's folder (its own answers, in its order, at its own forwards' prices),
RUN=PROMPTS (a run whose prompt file is not where its meta says), SPLIT.jsonl@CURVE (a corpus
split's reference answers, edit/copy/fim, priced at a curve: a run's folder or a calibration
file), any of them with #ID,ID... (those questions only), or FIRST+THEN: FIRST's answers
replayed, then THEN's, through the same policies and drafters (one server), THEN's answers
reported, priced at THEN's. Lookups free; `ngram` alone (the server's default lookup) and with
`suffix`:

    python docs/bench/policy-unseen/carry-over/replay_carry.py base,kind \
        docs/bench/cross-vocab/he-qwen05=docs/bench/cross-vocab/humaneval-test.jsonl+docs/bench/policy-unseen/zen4/specbench-10

The variants set the policy's constant or skip the estimate's method in this script.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from draftwise import models
from draftwise.backends.base import text_marks
from draftwise.bench.offline import account, replay
from draftwise.bench.suites import prompts
from draftwise.cli.replay import _sources
from draftwise.drafters.ngram import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.loading import LoadOptions, load_backend
from draftwise.policy import estimates

Copy = estimates.CopyEstimate
BEGIN, BELOW = Copy.begin_request, estimates.KIND_BELOW


VARIANTS = {
    "base": {"begin_request": lambda self, kind: None},
    "kind": {},
    "kind-all": {"below": math.inf},
    "kind8": {"below": 8},
}
SHOWN = (442,)  # the question: Spec-Bench math, asked after eight HumanEval problems
SETS = {"ngram": lambda: [NgramDrafter()], "ngram+suffix": lambda: [NgramDrafter(), SuffixDrafter()]}


def install(name: str) -> None:
    patches = VARIANTS[name]
    Copy.begin_request = patches.get("begin_request", BEGIN)
    estimates.KIND_BELOW = patches.get("below", BELOW)


def load(source: str):
    """(prompts, answers, curve, prices) of one source (the module docstring's forms; #ID,ID...
    after one keeps those questions only)."""
    if "#" in source:
        source, ids = source.split("#")
        pool, answers, curve, prices = load(source)
        keep = {int(i) for i in ids.split(",")}
        return [p for p in pool if p.question_id in keep], answers, curve, prices
    if "@" in source:
        split, priced = source.split("@")
        pool = prompts.filter_categories(prompts.load_prompts(split), ["edit", "copy", "fim"])
        data = json.loads((Path(priced) / "results.json" if Path(priced).is_dir() else Path(priced)).read_text())
        curve = replay.calibrated_curve(data)
        return (
            pool,
            replay.reference_answers(pool),
            curve,
            account.run_prices(data, curve) if "records" in data else None,
        )
    if "=" in source:  # a run whose prompt file is not where its meta says
        run_dir, prompt_file = source.split("=")
        results = json.loads((Path(run_dir) / "results.json").read_text())
        pool, answers = prompts.load_prompts(prompt_file), replay.baseline_answers(results)
    else:
        results, pool, answers = _sources(source, None)
    curve = replay.calibrated_curve(results)
    return pool, answers, curve, account.run_prices(results, curve)


def run(source: str, names: list[str], tokenizer, marks) -> list[replay.ReplayRun]:
    """Every variant and drafter set over one source; the runs of the answers it reports."""
    loaded = [load(part) for part in source.split("+")]
    pool = [p for part in loaded for p in part[0]]
    answers = {key: text for part in loaded for key, text in part[1].items()}
    _, _, curve, prices = loaded[-1]
    reported = {p.question_id for p in loaded[-1][0]}
    if len({p.question_id for p in pool}) != len(pool):
        raise SystemExit(f"{source}: question ids repeat across its parts")
    out = []
    for name in names:
        install(name)
        # One policy per set through every part, as one server's: drafters afresh for each
        # variant, so no history is carried between variants.
        sets = {f"{name}/{set_name}": make() for set_name, make in SETS.items()}
        runs = replay.replay(
            pool,
            answers,
            tokenizer,
            sets,
            curve,
            count_lookups=False,
            line_ends=marks.line_ends,
            fences=marks.fences,
            prices=prices,
        )
        out += [r for r in runs if r.question_id in reported]
    install("kind")
    return out


def main(names: list[str], sources: list[str]) -> None:
    backend = load_backend(models.DEFAULT_TARGET, LoadOptions(n_ctx=256))
    tokenizer = backend.tokenizer
    marks = text_marks(tokenizer, backend.vocab_size)
    try:
        for source in sources:
            runs = run(source, names, tokenizer, marks)
            summary = replay.summarize(runs)
            columns = [f"{n}/{s}" for s in SETS for n in names]
            print(f"\n{source}\n| category | " + " | ".join(columns) + " |")
            print("|---" * (len(columns) + 1) + "|")
            for category, by_set in summary.items():
                cells = [f"{by_set[c]['speedup']:.3f}x" if c in by_set else "" for c in columns]
                print(f"| {category} ({next(iter(by_set.values()))['turns']}) | " + " | ".join(cells) + " |")
            drafted = {c: sum(r.num_tokens - r.num_steps for r in runs if r.drafters == c) for c in columns}
            print("| tokens saved | " + " | ".join(str(drafted[c]) for c in columns) + " |")
            for r in runs:
                if r.question_id in SHOWN:
                    saved = r.num_tokens - r.num_steps
                    print(f"question {r.question_id} {r.drafters}: {r.speedup:.3f}x, {saved} tokens saved")
            lows = sorted((r.speedup, r.question_id, r.drafters) for r in runs)[:3]
            print("lowest answers: " + ", ".join(f"{q} {d} {s:.3f}x" for s, q, d in lows if not math.isnan(s)))
    finally:
        backend.close()


if __name__ == "__main__":
    main(sys.argv[1].split(","), sys.argv[2:])
