#!/usr/bin/env python
"""What continuous batching buys on the transformers backend: S sequences with different cached
lengths, each adding r rows, in one padded forward (`extend_batch`) against S forwards of their
own, alternating, median of repeats. Prints one line per (S, r) and the ratio.

    python scripts/measure_hf_batching.py --model qwen2.5-coder-0.5b-instruct --dtype bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import time

from draftwise.loading import LoadOptions, load_backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--slots", default="2,4")
    parser.add_argument("--rows", default="1,5")
    parser.add_argument("--context", type=int, default=200, help="Cached tokens of the longest sequence.")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    slots = [int(s) for s in args.slots.split(",")]
    backend = load_backend(
        args.model,
        LoadOptions(backend="hf", dtype=args.dtype, device=args.device, slots=max(slots), n_ctx=args.context + 64),
    )
    print(f"{args.model} {args.dtype} on {backend.capabilities.device}, {backend.n_threads} threads")
    vocab = min(backend.vocab_size, 32000)
    for s in slots:
        seqs = [backend.sequence(i) for i in range(s)]
        lengths = [args.context - 37 * i for i in range(s)]  # unequal pasts: the padded case
        for seq, n in zip(seqs, lengths):
            seq.reset()
            seq.prefill([(7919 * j + 13 * n) % vocab for j in range(n)])
        for r in (int(x) for x in args.rows.split(",")):
            rows = [[(104729 * (j + i) + 17) % vocab for j in range(r)] for i in range(s)]
            batched, alone = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                backend.extend_batch([(seq, ids, r) for seq, ids in zip(seqs, rows)])
                batched.append(time.perf_counter() - t0)
                for seq, n in zip(seqs, lengths):
                    seq.truncate(n)
                t0 = time.perf_counter()
                for seq, ids in zip(seqs, rows):
                    seq.extend(ids, r)
                alone.append(time.perf_counter() - t0)
                for seq, n in zip(seqs, lengths):
                    seq.truncate(n)
            b, a = 1000 * statistics.median(batched), 1000 * statistics.median(alone)
            print(
                f"{s} sequences x {r} rows: one padded forward {b:.0f} ms, one forward each {a:.0f} ms, "
                f"ratio {a / b:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
