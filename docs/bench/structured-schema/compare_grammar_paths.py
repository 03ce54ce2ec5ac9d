#!/usr/bin/env python
"""Constrained decoding speed side by side: draftwise (llguidance masks) against llama-cpp-python's
own grammar sampler (LlamaGrammar.from_json_schema), on the structured_schema suite, greedy.

Per prompt, alternating in one process on the same model file: draftwise plain unconstrained,
draftwise plain constrained (speculation off), draftwise auto constrained, and llama-cpp-python's
create_chat_completion with the schema's grammar. Decode tok/s = tokens after the first / time from
the first streamed token to the last (prefill excluded alike). Prints a table and writes JSON.

    python docs/bench/structured-schema/compare_grammar_paths.py --out compare-grammar.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jsonschema

from draftwise.bench.suites.prompts import load_suite
from draftwise.constraints import Constraint
from draftwise.loading import load_engine
from draftwise.models import DEFAULT_TARGET, resolve
from draftwise.types import SamplingParams, SpeculationConfig


def timed(pieces) -> tuple[str, float, int]:
    """Join streamed pieces; (text, seconds from the first piece to the last, number of pieces)."""
    text, first, last, n = "", None, None, 0
    for piece in pieces:
        now = time.perf_counter()
        first = first or now
        last, n, text = now, n + 1, text + piece
    return text, (last - first) if first else 0.0, n


def draftwise_run(engine, messages, schema, spec, constrained: bool, max_tokens: int) -> dict:
    sampling = SamplingParams(max_tokens=max_tokens, constraint=Constraint.json_schema(schema) if constrained else None)
    gen = engine.stream(messages=messages, sampling=sampling, speculation=spec)
    text, _, _ = timed(gen)
    stats = gen.result.stats
    return {"text": text, "tokens": stats.num_generated, "tok_s": stats.tokens_per_second}


def llama_run(llm, messages, schema, max_tokens: int) -> dict:
    from llama_cpp import LlamaGrammar

    grammar = LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
    chunks = llm.create_chat_completion(
        messages=messages, grammar=grammar, temperature=0.0, max_tokens=max_tokens, stream=True
    )
    pieces = (c["choices"][0]["delta"].get("content") or "" for c in chunks)
    text, seconds, n = timed(p for p in pieces if p)
    tokens = len(llm.tokenize(text.encode(), add_bos=False, special=False))
    return {"text": text, "tokens": tokens, "tok_s": (tokens - 1) / seconds if seconds > 0 else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--limit", type=int, default=None, help="Only the first N prompts.")
    parser.add_argument("--out", default=None, help="Write the per-prompt figures here (JSON).")
    args = parser.parse_args()

    from llama_cpp import Llama

    engine = load_engine(args.target, "ngram,grammar")
    llm = Llama(
        str(resolve(args.target)),
        n_ctx=4096,
        n_threads=engine.target.n_threads,
        n_threads_batch=engine.target.n_threads,
        verbose=False,
    )
    plain, auto = SpeculationConfig(enabled=False), SpeculationConfig(policy="auto")
    prompts = load_suite("structured_schema")[: args.limit]
    engine.generate(
        messages=[{"role": "user", "content": "warm up"}], sampling=SamplingParams(max_tokens=4), speculation=auto
    )
    rows = []
    for p in prompts:
        messages = [{"role": "user", "content": p.turns[0]}]
        row = {
            "question_id": p.question_id,
            "unconstrained": draftwise_run(engine, messages, p.json_schema, plain, False, args.max_tokens),
            "constrained": draftwise_run(engine, messages, p.json_schema, plain, True, args.max_tokens),
            "auto": draftwise_run(engine, messages, p.json_schema, auto, True, args.max_tokens),
            "llama_grammar": llama_run(llm, messages, p.json_schema, args.max_tokens),
        }
        for run in row.values():
            if isinstance(run, dict):
                try:
                    run["schema_valid"] = jsonschema.validators.validator_for(p.json_schema)(p.json_schema).is_valid(
                        json.loads(run["text"])
                    )
                except json.JSONDecodeError:
                    run["schema_valid"] = False
        rows.append(row)
        print(p.question_id, {k: round(v["tok_s"], 1) for k, v in row.items() if isinstance(v, dict)}, flush=True)
    methods = ("unconstrained", "constrained", "auto", "llama_grammar")
    print(f"\n{'method':16} {'tok/s (mean)':>12} {'vs constrained':>15} {'schema valid':>13}")
    for m in methods:
        mean = statistics.mean(r[m]["tok_s"] for r in rows)
        ratio = statistics.geometric_mean(r[m]["tok_s"] / r["constrained"]["tok_s"] for r in rows)
        valid = sum(r[m]["schema_valid"] for r in rows) / len(rows)
        print(f"{m:16} {mean:12.1f} {ratio:14.2f}x {valid:13.0%}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"target": args.target, "max_tokens": args.max_tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
