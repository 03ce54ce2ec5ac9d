#!/usr/bin/env python
"""Whole-file edits side by side: draftwise `auto` (n-gram + suffix lookups) against llama.cpp's
`llama-speculative-simple --spec-type ngram-simple`, on the code_edit_long suite, greedy.

Per prompt and turn, alternating in one run on the same model file and thread count: draftwise
in this process, then llama.cpp's tool as a subprocess on the same chat-templated prompt. Later
turns of a conversation continue from the answers of a bench run's baseline (--results), as
the bench does, so both tools get the same task. Decode tok/s on both sides: generated tokens /
decode time, prompt processing excluded (llama.cpp's own "decoded N tokens in S seconds").

The tool is not part of draftwise: build it from the llama.cpp source inside the
llama-cpp-python sdist (its `examples/speculative-simple`) and pass its path.

    python docs/bench/code-edit-long/compare_llamacpp_ngram.py --bin PATH/llama-speculative-simple \\
        --results docs/bench/code-edit-long --out compare-ngram.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

from draftwise.bench.offline.replay import baseline_answers
from draftwise.bench.suites.prompts import load_suite
from draftwise.loading import LoadOptions, load_engine
from draftwise.models import DEFAULT_TARGET, resolve
from draftwise.types import SamplingParams, SpeculationConfig

DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
COUNT = re.compile(r"\b(n_drafted|n_accept)\s*=\s*(\d+)")


def llama_run(
    binary: str, model: str, prompt: str, max_tokens: int, n_ctx: int, threads: int, extra: list[str]
) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    env = {**os.environ, "LD_LIBRARY_PATH": str(Path(binary).parent)}
    try:
        # The tool decodes the whole prompt in one batch: -b must hold it (its default is 2048).
        out = subprocess.run(
            [
                binary,
                "-m",
                model,
                "-f",
                f.name,
                "-n",
                str(max_tokens),
                "-c",
                str(n_ctx),
                "-b",
                str(n_ctx),
                "-t",
                str(threads),
                "-tb",
                str(threads),
                "--temp",
                "0",
                "--spec-type",
                "ngram-simple",
                *extra,
            ],
            capture_output=True,
            text=True,
            env=env,
        )
    finally:
        os.unlink(f.name)
    log = out.stdout + out.stderr
    if out.returncode != 0:
        raise RuntimeError(f"{Path(binary).name} exited with {out.returncode}:\n{log[-2000:]}")
    decoded = DECODED.search(log)
    if decoded is None:
        raise RuntimeError(f"no timing line in the tool's output:\n{log[-2000:]}")
    tokens, seconds = int(decoded.group(1)), float(decoded.group(2))
    counts = {k: int(v) for k, v in COUNT.findall(log)}
    return {
        "tokens": tokens,
        "tok_s": tokens / seconds,
        "drafted": counts.get("n_drafted", 0),
        "accepted": counts.get("n_accept", 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, help="Path of llama.cpp's llama-speculative-simple.")
    parser.add_argument(
        "--results",
        required=True,
        help="A code_edit_long bench run with 'baseline' (its answers make the later turns' history).",
    )
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--limit", type=int, default=None, help="Only the first N prompts.")
    parser.add_argument(
        "--skip-turns",
        type=int,
        default=0,
        help="Start after the first N answers (to complete an interrupted run; see --merge).",
    )
    parser.add_argument("--merge", default=None, help="An earlier --out file whose rows come first.")
    parser.add_argument("--llama-args", default="", help="More arguments for the tool, space-separated.")
    parser.add_argument("--out", default=None, help="Write the per-turn figures here (JSON).")
    args = parser.parse_args()

    results_path = Path(args.results)
    results = json.loads((results_path / "results.json" if results_path.is_dir() else results_path).read_text())
    answers = baseline_answers(results)
    engine = load_engine(args.target, "ngram,suffix", options=LoadOptions(n_ctx=args.n_ctx))
    threads = engine.target.n_threads
    model = str(resolve(args.target))
    auto = SpeculationConfig(policy="auto")
    sampling = SamplingParams(max_tokens=args.max_tokens)
    engine.generate(
        messages=[{"role": "user", "content": "warm up"}], sampling=SamplingParams(max_tokens=4), speculation=auto
    )
    rows = json.loads(Path(args.merge).read_text())["rows"] if args.merge else []
    seen = 0
    for p in load_suite("code_edit_long")[: args.limit]:
        history: list[dict] = []
        for turn, text in enumerate(p.turns):
            answer = answers.get((p.question_id, turn))
            if answer is None:
                break
            messages = [*history, {"role": "user", "content": text}]
            history = [*messages, {"role": "assistant", "content": answer}]
            seen += 1
            if seen <= args.skip_turns:
                continue
            result = engine.generate(messages=messages, sampling=sampling, speculation=auto)
            ours = {
                "tokens": result.stats.num_generated,
                "tok_s": result.stats.tokens_per_second,
                "identical_to_baseline": result.text == answer,
            }
            prompt = engine.tokenizer.apply_chat_template(messages)
            theirs = llama_run(args.bin, model, prompt, args.max_tokens, args.n_ctx, threads, args.llama_args.split())
            rows.append(
                {"question_id": p.question_id, "turn": turn, "draftwise_auto": ours, "llama_ngram_simple": theirs}
            )
            print(
                p.question_id,
                turn,
                f"draftwise {ours['tok_s']:.1f} tok/s ({ours['tokens']} tokens)",
                f"llama.cpp {theirs['tok_s']:.1f} tok/s ({theirs['tokens']} tokens)",
                flush=True,
            )
            if args.out:  # after every answer: an interrupted run keeps what it measured
                _save(args, threads, rows)
    ratio = statistics.geometric_mean(r["draftwise_auto"]["tok_s"] / r["llama_ngram_simple"]["tok_s"] for r in rows)
    print(f"\n{'method':28} {'tok/s (mean)':>12}")
    for m in ("draftwise_auto", "llama_ngram_simple"):
        print(f"{m:28} {statistics.mean(r[m]['tok_s'] for r in rows):12.1f}")
    counted = [r["llama_ngram_simple"] for r in rows if r["llama_ngram_simple"].get("drafted")]
    acceptance = (
        f" (llama.cpp acceptance {sum(c['accepted'] for c in counted) / sum(c['drafted'] for c in counted):.0%}"
        f" over {len(counted)} turns)"
        if counted
        else ""
    )
    print(f"draftwise auto / llama.cpp ngram-simple, geometric mean over {len(rows)} turns: {ratio:.2f}x{acceptance}")
    if args.out:
        _save(args, threads, rows, ratio)


def _save(args, threads: int, rows: list[dict], ratio: float | None = None) -> None:
    with open(args.out, "w") as f:
        json.dump(
            {
                "target": args.target,
                "max_tokens": args.max_tokens,
                "threads": threads,
                "llama_args": args.llama_args,
                "ratio": ratio,
                "rows": rows,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
