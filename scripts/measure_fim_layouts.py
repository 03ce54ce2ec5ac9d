#!/usr/bin/env python
"""Prefix-suffix-middle against suffix-prefix-middle prompts: which one a model completes better.

In SPM order (llama.cpp's --spm-infill) the typed part of the line comes last, so while a user
types everything before it stays cached and each keystroke reads a few tokens instead of the
line and the whole suffix; that pays only if the model was trained to complete that way. Each
`fim` suite cut is completed greedily (speculation off, the prompt read afresh) in both orders,
cut as /infill cuts it, and scored against the removed text (exact match, edit similarity).

    python scripts/measure_fim_layouts.py [--target M] [--max-tokens 64] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

from draftwise import models
from draftwise.bench.suites.fim import quality
from draftwise.bench.suites.prompts import load_suite
from draftwise.fim import FimBudget, fim_prompt
from draftwise.loading import load_engine
from draftwise.types import SamplingParams, SpeculationConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=models.DEFAULT_TARGET)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", default=None, help="write every middle and its scores here (JSON)")
    args = parser.parse_args()
    engine = load_engine(args.target, draft=None, speculation=SpeculationConfig(enabled=False))
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    rows = []
    for cut in load_suite("fim"):
        for layout in ("psm", "spm"):
            ids = fim_prompt(engine.tokenizer, cut.turns[0], cut.suffix, budget=FimBudget(), spm=layout == "spm").ids
            engine.target.reset()  # nothing of the other order's read is reused
            result = engine.generate(prompt_ids=ids, sampling=sampling)
            rows.append({"cut": cut.question_id, "layout": layout, **quality(result.text, cut.reference)})
            rows[-1]["tokens"], rows[-1]["middle"] = len(result.token_ids), result.text
            print(cut.question_id, layout, rows[-1]["exact_match"], rows[-1]["edit_similarity"], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    for layout in ("psm", "spm"):
        mine = [r for r in rows if r["layout"] == layout]
        exact = sum(r["exact_match"] for r in mine)
        similarity = statistics.mean(r["edit_similarity"] for r in mine)
        print(f"{layout}: exact match {exact}/{len(mine)}, mean edit similarity {similarity:.3f}")


if __name__ == "__main__":
    main()
