#!/usr/bin/env python
"""Build a Spec-Bench "mini" prompt file for `draftwise bench --prompts`: a few questions of each
of Spec-Bench's six tasks (MT-bench's eight categories pooled as `mt_bench`; translation,
summarization, qa, math_reasoning, rag), chosen with a seed.

Spec-Bench (github.com/hemingkx/Spec-Bench, Apache-2.0) ships its questions in
data/spec_bench/question.jsonl; the file is read from a checkout of it and nothing of it is
shipped here. Its records already have draftwise's prompt format (question_id, category, turns).

    python scripts/make_specbench_mini.py --questions Spec-Bench/data/spec_bench/question.jsonl \
        --per-task 3 --out specbench-mini.jsonl
    draftwise bench --prompts specbench-mini.jsonl --methods baseline,auto --max-tokens 256
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def mini(rows: list[dict], per_task: int, seed: int, first_turn_only: bool) -> list[dict]:
    """per_task questions of each task, in question order; MT-bench's categories become mt_bench."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        task = "mt_bench" if row["category"] in MT_BENCH else row["category"]
        by_task[task].append(row)
    missing = [t for t in TASKS if not by_task.get(t)]
    if missing:
        raise SystemExit(f"no questions of task(s) {', '.join(missing)}: is this Spec-Bench's question.jsonl?")
    rng = random.Random(seed)
    out = []
    for task in TASKS:
        chosen = sorted(rng.sample(by_task[task], min(per_task, len(by_task[task]))), key=lambda r: r["question_id"])
        for row in chosen:
            turns = row["turns"][:1] if first_turn_only else row["turns"]
            out.append({"question_id": row["question_id"], "category": task, "turns": turns})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", required=True, type=Path, help="Spec-Bench's data/spec_bench/question.jsonl")
    parser.add_argument("--per-task", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first-turn-only", action="store_true", help="MT-bench questions with their first turn only")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    if args.per_task < 1:
        raise SystemExit("--per-task must be at least 1")
    try:
        rows = [json.loads(line) for line in args.questions.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"cannot read {args.questions}: {e}") from e
    prompts = mini(rows, args.per_task, args.seed, args.first_turn_only)
    args.out.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in prompts), encoding="utf-8")
    print(f"{len(prompts)} prompts ({args.per_task} per task) -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
