"""Measure how much llama.cpp's batched verification shifts the top-2 margin.

Teacher-forced: decode each prompt's plain greedy continuation one token at a time,
then again in verification-sized batches (k+1 rows), and compare, at every position,
the gap between the plain run's top-2 tokens. Prints percentiles of |change|; the
real-pair equivalence test's MARGIN_BOUND comes from these numbers.

    python scripts/measure_batch_drift.py --k 8 --tokens 64
"""

import argparse
import sys

import numpy as np

sys.path.insert(0, "tests")
from integration.test_real_pair import PROMPTS  # noqa: E402

from draftwise import models  # noqa: E402
from draftwise.loading import load_engine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    engine = load_engine(str(models.resolve(models.DEFAULT_TARGET)), "none")
    target = engine.target
    for k in args.k:
        changes = []
        for prompt in PROMPTS:
            ids = engine.encode_prompt(messages=[{"role": "user", "content": prompt}])
            target.reset()
            target.prefill(ids[:-1])
            seq, rows = [ids[-1]], []
            for _ in range(args.tokens):
                row = target.extend([seq[-1]])[0]
                rows.append(row)
                seq.append(int(row.argmax()))
            single = np.stack(rows)
            target.reset()
            target.prefill(ids[:-1])
            batched = np.concatenate([target.extend(seq[i : i + k + 1]) for i in range(0, args.tokens, k + 1)])[
                : args.tokens
            ]
            top2 = np.argsort(single, axis=-1)[:, -2:]
            idx = np.arange(args.tokens)
            gap_single = single[idx, top2[:, 1]] - single[idx, top2[:, 0]]
            gap_batched = batched[idx, top2[:, 1]] - batched[idx, top2[:, 0]]
            changes.extend(np.abs(gap_single - gap_batched).tolist())
        c = np.array(changes)
        print(
            f"k={k}: {len(c)} positions, |margin change| median {np.median(c):.4f}, p99 {np.percentile(c, 99):.4f}, "
            f"p99.9 {np.percentile(c, 99.9):.4f}, max {c.max():.4f}"
        )


if __name__ == "__main__":
    main()
