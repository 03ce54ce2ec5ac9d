"""How far llama.cpp's batched rows drift from its single-row logits for the same prefix, per
rows and context (docs/exactness.md, "Batched rows drift").

Teacher-forced on the target's own greedy continuation: decode each prompt's continuation one
token at a time (single rows), then feed the same tokens again in forwards of n rows, as a
verification does, on the same prefix (the cache truncated back to the prompt), and compare, at
every position, the log-softmax rows: the change of the margin between the single run's top two
tokens (what decides a greedy answer) and the largest change of any token's log-probability in
the top 20. Contexts are the prompts padded in front with source text to about each --contexts
size. Prints one line per rows x context and writes them as JSON lines with --out.

A greedy answer that parts from plain decoding's at a position whose top-2 margin is inside the
margin drift measured for its rows and context is explained by the batch shape, not a bug.

    python scripts/measure_batch_drift.py --rows 2,4,8,16,33,65 --contexts 100,1000,4000 --tokens 65
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, "tests")
from integration.test_real_pair import PROMPTS  # noqa: E402

from draftwise import models  # noqa: E402
from draftwise.loading import LoadOptions, load_engine  # noqa: E402


def log_softmax(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64)
    rows -= rows.max(axis=-1, keepdims=True)
    return rows - np.log(np.exp(rows).sum(axis=-1, keepdims=True))


def padding_text() -> str:
    """Source text to pad prompts with (this standard library's textwrap and json modules)."""
    return inspect.getsource(textwrap) + inspect.getsource(json.decoder) + inspect.getsource(json.encoder)


def prompt_ids(engine, prompt: str, context: int, pad: str) -> list[int]:
    """The chat prompt, preceded by as much source text as brings it to about `context` tokens."""
    ids = engine.encode_prompt(messages=[{"role": "user", "content": prompt}])
    if context <= len(ids):
        return ids
    tokenizer = engine.target.tokenizer
    pad_ids = tokenizer.encode(pad, add_special=False, parse_special=False)
    need = context - len(ids)
    text = tokenizer.decode(pad_ids[:need])
    content = f"Here is some code for reference:\n```python\n{text}\n```\n\n{prompt}"
    return engine.encode_prompt(messages=[{"role": "user", "content": content}])


def drift(target, ids: list[int], tokens: int, rows: list[int]) -> dict[int, dict]:
    """{n: {"margin": [...], "top20": [...]}} over the positions of the greedy continuation."""
    target.reset()
    target.prefill(ids[:-1])
    seq, single = [ids[-1]], []
    for _ in range(tokens):
        row = target.extend([seq[-1]])[0]
        single.append(row)
        seq.append(int(row.argmax()))
    single = log_softmax(np.stack(single))
    top2 = np.argsort(single, axis=-1)[:, -2:]
    top20 = np.argsort(single, axis=-1)[:, -20:]
    idx = np.arange(tokens)
    margin_single = single[idx, top2[:, 1]] - single[idx, top2[:, 0]]
    out = {}
    for n in rows:
        target.truncate(len(ids) - 1)
        batched = np.concatenate([target.extend(seq[i : i + n]) for i in range(0, tokens, n)])[:tokens]
        batched = log_softmax(batched)
        margin = batched[idx, top2[:, 1]] - batched[idx, top2[:, 0]]
        top = np.abs(np.take_along_axis(single, top20, -1) - np.take_along_axis(batched, top20, -1)).max(-1)
        out[n] = {
            "margin": np.abs(margin - margin_single).tolist(),
            "top20": top.tolist(),
            "flips": int((batched.argmax(-1) != single.argmax(-1)).sum()),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="2,4,8,16,33,65", help="Rows per batched forward, comma-separated.")
    ap.add_argument("--contexts", default="100,1000,4000", help="Context sizes in tokens, comma-separated.")
    ap.add_argument("--tokens", type=int, default=65, help="Positions compared per prompt.")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="How many of the real-pair prompts.")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None, help="Write the lines as JSON lines here too.")
    args = ap.parse_args()
    rows = [int(x) for x in args.rows.split(",") if x.strip()]
    contexts = [int(x) for x in args.contexts.split(",") if x.strip()]
    n_ctx = max(4096, 2 ** int(np.ceil(np.log2(max(contexts) + args.tokens + 256))))
    engine = load_engine(
        str(models.resolve(models.DEFAULT_TARGET)), "none", options=LoadOptions(n_ctx=n_ctx, threads=args.threads)
    )
    target, pad = engine.target, padding_text()
    lines = []
    for context in contexts:
        pooled: dict[int, dict[str, list]] = {n: {"margin": [], "top20": [], "flips": 0} for n in rows}
        sizes, t0 = [], time.perf_counter()
        for prompt in PROMPTS[: args.prompts]:
            ids = prompt_ids(engine, prompt, context, pad)
            sizes.append(len(ids))
            for n, d in drift(target, ids, args.tokens, rows).items():
                pooled[n]["margin"] += d["margin"]
                pooled[n]["top20"] += d["top20"]
                pooled[n]["flips"] += d["flips"]
        for n in rows:
            m, t = np.array(pooled[n]["margin"]), np.array(pooled[n]["top20"])
            line = {
                "rows": n,
                "context": int(np.median(sizes)),
                "positions": len(m),
                "margin_median": round(float(np.median(m)), 4),
                "margin_p99": round(float(np.percentile(m, 99)), 4),
                "margin_max": round(float(m.max()), 4),
                "top20_max": round(float(t.max()), 4),
                "argmax_flips": pooled[n]["flips"],
            }
            lines.append(line)
            print(
                f"rows {n:3d}, context {line['context']:5d}: {line['positions']} positions, |margin change| median "
                f"{line['margin_median']:.4f}, p99 {line['margin_p99']:.4f}, max {line['margin_max']:.4f} nats; "
                f"top-20 log-prob change max {line['top20_max']:.4f}; argmax flips {line['argmax_flips']}",
                flush=True,
            )
        print(f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    if args.out is not None:
        args.out.write_text("".join(json.dumps(line) + "\n" for line in lines))


if __name__ == "__main__":
    main()
