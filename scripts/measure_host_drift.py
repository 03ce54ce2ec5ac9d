"""Does a drafting run make the target's one-row forwards dearer, or does the host move under both?

Part `pairs`: plain decoding and the auto policy (n-gram + suffix lookups, fresh each run) answer
the same prompt in turn, `--pairs` times (plain, auto, plain, auto, ...), in one process. Each auto
run's one-row forwards are set against the same pair's plain forwards at the same context (within
32 tokens): one ratio per pair, and one over every pair pooled. A cost that drafting itself adds
(lookups between forwards, many-row forwards before, the cache's rollbacks) shows in every pair
alike; the host's own drift (neighbours, frequency) moves pairs apart, both ways.
Part `sustained`: one-row forwards for --seconds, then 33-row forwards (compute-bound) for as long,
then one-row forwards again, timed by the second since: whether a sustained batch load leaves
the host slower afterwards (a power or frequency budget spent), as a long drafting run would.

Usage: python scripts/measure_host_drift.py [--prompts FILE --question-id N] [--pairs 6]
       [--max-tokens 200] [--parts pairs,sustained] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sysconfig
import time
from pathlib import Path

from draftwise import models
from draftwise.calibrate import _context_ids
from draftwise.loading import LoadOptions, free_drafter, load_backend
from draftwise.types import SamplingParams, SpeculationConfig

NEAR = 32  # tokens of context within which a plain forward is the same forward


def default_prompt() -> str:
    """An edit that mixes copying with new text: docstrings added to a standard-library module."""
    source = Path(sysconfig.get_paths()["stdlib"], "shlex.py").read_text()[:2400]
    ask = "Add a one-line docstring to every function in this file and give the whole file back:"
    return f"{ask}\n```python\n{source}\n```"


def one_row(step_times) -> list[tuple[int, float]]:
    return [(ctx, ms) for rows, ctx, ms, _ in step_times if rows == 1]


def matched_ratios(auto: list[tuple[int, float]], plain: list[tuple[int, float]]) -> list[float]:
    """Each auto one-row forward over the median of plain's at the same context (>= 5 of them)."""
    out = []
    for ctx, ms in auto:
        near = [p for c, p in plain if abs(c - ctx) <= NEAR]
        if len(near) >= 5:
            out.append(ms / statistics.median(near))
    return out


def pairs_part(args, x) -> dict:
    from draftwise.engine import Engine

    prompt = default_prompt()
    if args.prompts:
        rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
        prompt = next(r for r in rows if r["question_id"] == args.question_id)["turns"][0]
    runs = []
    for i in range(args.pairs):
        pair = {}
        for name, speculation in (
            ("plain", SpeculationConfig(enabled=False)),
            ("auto", SpeculationConfig(policy="auto")),
        ):
            engine = Engine(x, [free_drafter("ngram"), free_drafter("suffix")], speculation=speculation)
            result = engine.generate(
                messages=[{"role": "user", "content": prompt}], sampling=SamplingParams(max_tokens=args.max_tokens)
            )
            pair[name] = [list(t) for t in result.stats.step_times]
        ratios = matched_ratios(one_row(pair["auto"]), one_row(pair["plain"]))
        pair["ratio"] = round(statistics.median(ratios), 3) if ratios else None
        pair["matched"] = len(ratios)
        pair["plain_one_row_ms"] = round(statistics.median(ms for _, ms in one_row(pair["plain"])), 1)
        print(f"pair {i}: auto / plain one-row {pair['ratio']} over {len(ratios)} forwards", flush=True)
        runs.append(pair)
    every_plain = [f for pair in runs for f in one_row(pair["plain"])]
    pooled = [r for pair in runs for r in matched_ratios(one_row(pair["auto"]), every_plain)]
    return {
        "runs": runs,
        "by_pair": [p["ratio"] for p in runs],
        "pooled": round(statistics.median(pooled), 3) if pooled else None,
        "pooled_forwards": len(pooled),
    }


def timed(x, n: int) -> float:
    keep = x.num_cached
    ids = [(104729 * (j + keep) + 17) % min(x.vocab_size, 32000) for j in range(n)]
    t0 = time.perf_counter()
    x.extend(ids)
    ms = 1000 * (time.perf_counter() - t0)
    x.truncate(keep)
    return ms


def for_seconds(x, n: int, seconds: float) -> list[tuple[float, float]]:
    out, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        out.append((time.perf_counter() - start, timed(x, n)))
    return out


def sustained_part(args, x) -> dict:
    x.reset()
    x.prefill(_context_ids(args.context, x.vocab_size))
    rounds = []
    for i in range(args.rounds):
        before = for_seconds(x, 1, args.seconds)
        batch = for_seconds(x, 33, args.seconds)
        after = for_seconds(x, 1, args.seconds)
        by_second: dict[int, list[float]] = {}
        for t, ms in after:
            by_second.setdefault(int(t // 2.5), []).append(ms)
        rounds.append(
            {
                "one_row_before_ms": round(statistics.median(ms for t, ms in before if t > args.seconds / 2), 1),
                "batch_first_ms": [round(ms) for _, ms in batch[:3]],
                "batch_last_ms": [round(ms) for _, ms in batch[-3:]],
                "one_row_after_ms_by_2_5s": [round(statistics.median(v), 1) for _, v in sorted(by_second.items())],
            }
        )
        print(f"round {i}: {json.dumps(rounds[-1])}", flush=True)
    return {"context": args.context, "seconds": args.seconds, "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=models.DEFAULT_TARGET)
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: every CPU)")
    parser.add_argument("--parts", default="pairs,sustained")
    parser.add_argument("--prompts", default=None, help="a prompt file (e.g. a `draftwise corpus` split)")
    parser.add_argument("--question-id", type=int, default=None, help="the prompt of --prompts to answer")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--context", type=int, default=1024, help="tokens of context in part `sustained`")
    parser.add_argument("--seconds", type=float, default=20.0, help="each phase of part `sustained`")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.prompts and args.question_id is None:
        parser.error("--prompts needs --question-id")
    x = load_backend(args.target, LoadOptions(n_ctx=args.n_ctx, threads=args.threads))
    out: dict = {"argv": args.__dict__}
    with open("/proc/loadavg") as f:
        out["loadavg_start"] = f.read().split()[:3]
    if "pairs" in args.parts:
        out["pairs"] = pairs_part(args, x)
        print(f"pooled: auto / plain one-row {out['pairs']['pooled']} over {out['pairs']['pooled_forwards']} forwards")
    if "sustained" in args.parts:
        out["sustained"] = sustained_part(args, x)
    with open("/proc/loadavg") as f:
        out["loadavg_end"] = f.read().split()[:3]
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    x.close()


if __name__ == "__main__":
    main()
