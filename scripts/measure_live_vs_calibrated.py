"""Why live many-row forwards cost more than the calibration says: A/B pairs in one process.

Part 1 (`engine`): the engine decodes copy prompts (n-gram drafts, fixed k); right after each of
its forwards the same number of rows is timed as calibration times them (extend + truncate) on
the same cache, so live / calibration-style isolates the step around the forward, and both are
priced at a curve measured (calibrate.measure_grid) in the same process just before.
Part 2 (`factors`): one factor at a time, a calibration-style forward (A) against the same rows
and context in another condition (B), interleaved ABBA... so the shared machine's load falls on
both alike; each cell is the median of the pairs' B/A ratios.

Usage: python scripts/measure_live_vs_calibrated.py [--target MODEL] [--n-ctx 4096]
       [--context 1024] [--repeats 8] [--parts engine,factors] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from draftwise import models
from draftwise.calibrate import CostCurve, _context_ids, measure_grid
from draftwise.loading import LoadOptions, free_drafter, load_backend
from draftwise.policy.cost import TargetTime, shape_bucket
from draftwise.types import SamplingParams, SpeculationConfig


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def ids_for(n: int, vocab: int, salt: int = 0) -> list[int]:
    return [(104729 * (j + n + salt) + 17) % min(vocab, 32000) for j in range(n)]


def forward(backend, n: int, num_logits: int | None = None) -> float:
    """ms of one calibration-style forward: extend(n) at the cached length, then truncate back."""
    keep = backend.num_cached
    t0 = time.perf_counter()
    backend.extend(ids_for(n, backend.vocab_size), num_logits)
    ms = 1000 * (time.perf_counter() - t0)
    backend.truncate(keep)
    return ms


def pairs(sizes, repeats: int, run_a: Callable[[int], float], run_b: Callable[[int], float]) -> dict:
    """Per size: medians of A and B and of the pairs' B/A, order alternating AB, BA, ..."""
    got: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
    for r in range(repeats):
        for n in sizes:
            if r % 2 == 0:
                a = run_a(n)
                b = run_b(n)
            else:
                b = run_b(n)
                a = run_a(n)
            got[n].append((a, b))
    return {
        n: {
            "a_ms": round(statistics.median(a for a, _ in ab), 1),
            "b_ms": round(statistics.median(b for _, b in ab), 1),
            "ratio": round(statistics.median(b / a for a, b in ab), 3),
            "pairs": len(ab),
            "a": [round(a, 1) for a, _ in ab],
            "b": [round(b, 1) for _, b in ab],
        }
        for n, ab in got.items()
    }


def fill(backend, context: int, *, rollbacks: bool = False) -> None:
    """backend's cache to `context` tokens: one prefill, or (rollbacks) the last 256 written as a
    live run writes them: forwards of 17 rows of which 9 are kept."""
    backend.reset()
    ids = _context_ids(context, backend.vocab_size)
    start = context - 256 if rollbacks else context
    backend.prefill(ids[:start])
    while backend.num_cached < context:
        keep = min(9, context - backend.num_cached)
        at = backend.num_cached
        backend.extend(ids[at : at + keep] + ids_for(17 - keep, backend.vocab_size, salt=at))
        backend.truncate(at + keep)


def factors(args, x) -> list[dict]:
    """The factor table (part 2): each row a named condition B against calibration-style A on x."""
    ctx, sizes, reps = args.context, args.sizes, args.repeats
    rows: list[dict] = []

    def add(name: str, condition: str, result: dict) -> None:
        rows.append({"factor": name, "condition": condition, "context": ctx, "by_rows": result})
        print(name, condition, json.dumps(result), flush=True)

    fill(x, ctx)
    if "step" in args.factors:
        step_factors(x, sizes, reps, add)
    if "cache" in args.factors:
        y = load_backend(args.target, LoadOptions(n_ctx=args.n_ctx, threads=args.threads))
        fill(y, ctx)
        same = pairs(sizes, reps, lambda n: forward(x, n), lambda n: forward(y, n))
        add("cache", "a second context, one prefill", same)
        fill(y, ctx, rollbacks=True)
        add(
            "cache",
            "last 256 positions written after rollbacks",
            pairs(sizes, reps, lambda n: forward(x, n), lambda n: forward(y, n)),
        )
        y.close()
    if "slots" in args.factors:
        # NOTE: a context with several sequences is created by the backend itself, with llama.cpp's
        # default flash attention (auto: on, on CPU); Llama(), one sequence, has it off.
        s = load_backend(args.target, LoadOptions(n_ctx=args.n_ctx, slots=4, threads=args.threads))
        fill(s, ctx)
        add(
            "cache",
            "4-slot unified cache, 1 slot used",
            pairs(sizes, reps, lambda n: forward(x, n), lambda n: forward(s, n)),
        )
        for slot in (1, 2, 3):
            fill(s.sequence(slot), ctx)
        add(
            "cache",
            "4-slot unified cache, 4 slots used",
            pairs(sizes, reps, lambda n: forward(x, n), lambda n: forward(s, n)),
        )
        s.close()
    if "attention" in args.factors:
        add(*flash_attention(args, sizes, reps))
    return rows


def flash_attention(args, sizes, reps: int) -> tuple[str, str, dict]:
    """A context of several sequences as the backend makes it (llama.cpp's default flash
    attention: auto, on for CPU) against the same with flash attention off (as Llama() has it)."""
    from llama_cpp import llama_cpp as C

    options = LoadOptions(n_ctx=args.n_ctx, slots=4, threads=args.threads)
    auto = load_backend(args.target, options)
    default_params = C.llama_context_default_params

    def without_flash_attention():
        params = default_params()
        params.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_DISABLED
        return params

    C.llama_context_default_params = without_flash_attention
    try:
        off = load_backend(args.target, options)
    finally:
        C.llama_context_default_params = default_params
    fill(auto, args.context)
    fill(off, args.context)
    result = pairs(sizes, reps, lambda n: forward(off, n), lambda n: forward(auto, n))
    auto.close()
    off.close()
    return "attention", "4-slot context, flash attention auto (A: off)", result


def step_factors(x, sizes, reps: int, add) -> None:
    """What runs around a live forward on x: nothing, Python work, an idle gap, the logits rows."""
    add(
        "none (A against A)",
        "the same forward twice",
        pairs(sizes, reps, lambda n: forward(x, n), lambda n: forward(x, n)),
    )
    scratch = np.ones(64 * 2**20 // 4, dtype=np.float32)
    logits = np.random.default_rng(0).standard_normal((65, x.vocab_size)).astype(np.float32)

    def after_work(n: int) -> float:
        rows_ = logits[:n]
        np.argmax(rows_, axis=1)  # greedy verification of n rows
        z = rows_[0] - rows_[0].max()
        z - np.log(np.exp(z).sum())  # a log-softmax (logprobs)
        scratch[:] += 1.0  # 64 MiB written: lookups' and sampling's memory traffic
        return forward(x, n)

    add("what ran before", "verification + 64 MiB written", pairs(sizes, reps, lambda n: forward(x, n), after_work))

    def after_idle(n: int) -> float:
        time.sleep(0.05)
        return forward(x, n)

    add("what ran before", "50 ms idle", pairs(sizes, reps, lambda n: forward(x, n), after_idle))
    add(
        "logits rows requested",
        "the last row only (A: every row)",
        pairs(sizes, reps, lambda n: forward(x, n), lambda n: forward(x, n, 1)),
    )


def engine_part(args, x) -> dict:
    """Part 1: live forwards of the engine against calibration-style ones right after them."""
    from draftwise.engine import Engine

    curve = measure_grid(x, args.grid_points, contexts=args.grid_contexts, repeats=args.grid_repeats)
    print("curve", json.dumps(curve.to_dict()["points"]), curve.growth, curve.growth_one, flush=True)
    records: list[dict] = []
    plain_extend = x.extend

    def extend(ids, num_logits=None):
        at = x.num_cached
        t0 = time.perf_counter()
        out = plain_extend(ids, num_logits)
        live = 1000 * (time.perf_counter() - t0)
        n = len(ids)
        if num_logits == n and n <= 65:  # a decoding step (not a prompt)
            calib = forward(x, n)
            records.append({"rows": n, "context": at, "live_ms": live, "calib_ms": calib})
        return out

    x.extend = extend
    import sysconfig

    for i, name in enumerate(args.files.split(",")):
        k = args.k[i % len(args.k)]  # the files' draft lengths in turn: several buckets of rows
        engine = Engine(x, [free_drafter("ngram")], speculation=SpeculationConfig(policy="fixed", max_draft_tokens=k))
        source = Path(sysconfig.get_paths()["stdlib"], name).read_text()[: args.source_chars]
        prompt = f"Repeat this file exactly, with no comment:\n```python\n{source}\n```"
        engine.generate(
            messages=[{"role": "user", "content": prompt}], sampling=SamplingParams(max_tokens=args.max_tokens)
        )
    del x.extend
    return {"curve": curve.to_dict(), "by_bucket": engine_table(records, curve), "records": records}


def engine_table(records: list[dict], curve: CostCurve) -> dict:
    """Per rows bucket: live / calibration-style forward (same rows, same cache, just after), and
    each against the curve; the live forwards against the prices TargetTime predicted for them
    (the curve corrected by load and by the forwards before each: policy/prices.py)."""
    predicted = TargetTime(curve=curve)
    for r in records:  # in the run's order: each price predicted before its forward is observed
        r["predicted_ms"] = predicted.ms(r["rows"], r["context"])
        predicted.observe(r["rows"], r["live_ms"], r["context"])
    by_bucket: dict[int, list[dict]] = {}
    for r in records:
        by_bucket.setdefault(shape_bucket(r["rows"]), []).append(r)

    def med(values) -> float:
        return round(statistics.median(values), 3)

    table = {}
    for bucket, rs in sorted(by_bucket.items()):
        late = rs[len(rs) // 2 :]  # the second half: after the prices had forwards to learn from
        table[bucket] = {
            "forwards": len(rs),
            "live_ms": round(statistics.median(r["live_ms"] for r in rs), 1),
            "live_over_calib": med(r["live_ms"] / r["calib_ms"] for r in rs),
            "live_over_curve": med(r["live_ms"] / curve.ms(r["rows"], r["context"]) for r in rs),
            "calib_over_curve": med(r["calib_ms"] / curve.ms(r["rows"], r["context"]) for r in rs),
            "late_live_over_curve": med(r["live_ms"] / curve.ms(r["rows"], r["context"]) for r in late),
            "late_live_over_corrected": med(r["live_ms"] / r["predicted_ms"] for r in late),
        }
        print(bucket, json.dumps(table[bucket]), flush=True)
    return table


def print_tables(out: dict) -> None:
    """The output as markdown: part 2's B/A medians per size, part 1's ratios per rows bucket."""
    if out.get("factors"):
        sizes = list(out["factors"][0]["by_rows"])
        print("| factor | condition B (A: calibration-style) | " + " | ".join(f"{n} rows B/A" for n in sizes) + " |")
        print("|---|---|" + "---|" * len(sizes))
        for row in out["factors"]:
            cells = " | ".join(f"{r['ratio']:.3f}" for r in row["by_rows"].values())
            print(f"| {row['factor']} | {row['condition']} | {cells} |")
    if out.get("engine"):
        saved = out["engine"]
        table = engine_table(saved["records"], CostCurve.from_dict(saved["curve"]))
        print(
            "| rows | forwards | live / calibration-style | live / curve "
            "| second half: live / curve | live / corrected |"
        )
        print("|---|---|---|---|---|---|")
        for bucket, t in table.items():
            rows = f"{int(bucket) // 2 + 1}-{bucket}" if int(bucket) > 2 else str(bucket)
            print(
                f"| {rows} | {t['forwards']} | {t['live_over_calib']:.3f} | {t['live_over_curve']:.3f} | "
                f"{t['late_live_over_curve']:.3f} | {t['late_live_over_corrected']:.3f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=models.DEFAULT_TARGET)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: every CPU)")
    parser.add_argument("--context", type=int, default=1024, help="tokens of context in part 2")
    parser.add_argument("--repeats", type=int, default=8, help="pairs per size in part 2")
    parser.add_argument("--parts", default="engine,factors")
    parser.add_argument("--factors", default="step,cache,slots,attention", help="part 2's groups")
    parser.add_argument("--k", type=ints, default=(48,), help="part 1's draft lengths, one per file in turn")
    parser.add_argument("--max-tokens", type=int, default=320)
    parser.add_argument("--source-chars", type=int, default=2400)
    parser.add_argument("--sizes", type=ints, default=(1, 8, 33), help="part 2's forward sizes")
    parser.add_argument("--grid-points", type=ints, default=(1, 2, 4, 8, 16, 24, 32, 48, 64))
    parser.add_argument("--grid-contexts", type=ints, default=(256, 1024))
    parser.add_argument("--grid-repeats", type=int, default=3)
    parser.add_argument("--files", default="textwrap.py,shlex.py", help="standard-library modules part 1 copies")
    parser.add_argument("--out", default=None)
    parser.add_argument("--table", default=None, help="only print part 1's table from a saved --out file")
    args = parser.parse_args()
    if args.table:
        print_tables(json.loads(Path(args.table).read_text()))
        return
    x = load_backend(args.target, LoadOptions(n_ctx=args.n_ctx, threads=args.threads))
    out: dict = {"argv": sys.argv[1:]}
    with open("/proc/loadavg") as f:
        out["loadavg_start"] = f.read().split()[:3]
    parts = args.parts.split(",")
    if "engine" in parts:
        out["engine"] = engine_part(args, x)
    if "factors" in parts:
        out["factors"] = factors(args, x)
    with open("/proc/loadavg") as f:
        out["loadavg_end"] = f.read().split()[:3]
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    print_tables(out)
    x.close()


if __name__ == "__main__":
    main()
