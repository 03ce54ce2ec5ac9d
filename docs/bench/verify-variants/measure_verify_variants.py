#!/usr/bin/env python
"""What one verification row costs, per tensor type: the default target with its Q6_K tensors
converted to another type llama.cpp multiplies faster on this CPU, against the original.

For each variant: the cost of a forward over n = 1..64 rows with logits for every row (what
verification needs), measured as `draftwise calibrate` does, in alternating rounds; its quality
against the original (llama.cpp's perplexity tool on a corpus built from this Python's standard
library sources: perplexity, KL divergence and top-1 agreement with the original's token
distributions); and greedy agreement of plain decoding with the original's on the quick
suite. Also the original under llama.cpp context options that may change the multi-row curve
(flash attention, micro-batch size, KV cache type). Writes JSON and a Markdown table.

The variants are built with llama.cpp's quantize tool and measured with its perplexity tool;
neither is part of draftwise: build them from the llama.cpp source inside the
llama-cpp-python sdist (`tools/quantize`, `tools/perplexity`) and pass their paths.

    python docs/bench/verify-variants/measure_verify_variants.py --quantize PATH/llama-quantize \\
        --perplexity PATH/llama-perplexity --work /tmp/variants --out docs/bench/verify-variants
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

from draftwise.backends.base import common_prefix_length
from draftwise.bench.reports.report import always_right_ceiling
from draftwise.calibrate import CostCurve, measure
from draftwise.models import DEFAULT_TARGET, resolve

POINTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# Types with a repacked GEMM kernel for x86 in this llama.cpp (ggml-cpu/repack.cpp: Q4_0, Q4_K
# and IQ4_NL 8x8 on AVX2), and Q8_0 (tinyBLAS) as the higher-precision control.
TYPES = ("q4_0", "iq4_nl", "q4_k", "q8_0")
CORPUS_MODULES = (
    "argparse",
    "functools",
    "dataclasses",
    "pathlib",
    "textwrap",
    "json/decoder",
    "json/encoder",
    "heapq",
    "bisect",
    "csv",
    "shutil",
    "string",
    "fractions",
    "statistics",
    "enum",
)


def corpus(path: Path, max_chars: int) -> str:
    """Standard library sources (code and docstrings), a fixed list in a fixed order."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    text = "\n\n".join((lib / f"{m}.py").read_text(encoding="utf-8") for m in CORPUS_MODULES)[:max_chars]
    path.write_text(text, encoding="utf-8")
    return hashlib.sha256(text.encode()).hexdigest()


def tensor_types(model: Path) -> dict[str, str]:
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(str(model)).tensors}


def build_variant(tool: str, src: Path, dst: Path, qtype: str) -> None:
    """src with only its Q6_K tensors converted to qtype. Every other quantised tensor is named
    with its own type (the tool copies a tensor already of the type asked for); left to the
    Q4_K_M mixture, the tool would turn twelve of the Q4_K tensors into Q6_K."""
    if dst.is_file():
        return
    types = tensor_types(src)
    overrides = dst.with_suffix(".types.txt")
    overrides.write_text(
        "".join(
            f"^{re.escape(n)}$={qtype if t == 'Q6_K' else t.lower()}\n"
            for n, t in types.items()
            if t not in ("F32", "F16", "BF16")
        )
    )
    partial = dst.with_suffix(".partial")
    subprocess.run(
        [tool, "--allow-requantize", "--tensor-type-file", str(overrides), str(src), str(partial), "Q4_K_M"],
        check=True,
        capture_output=True,
        env=_env(tool),
    )
    got, want = tensor_types(partial), {n: (qtype.upper() if t == "Q6_K" else t) for n, t in types.items()}
    wrong = {n: (want[n], got.get(n)) for n in want if got.get(n) != want[n]}
    if wrong:
        raise SystemExit(f"{dst.name}: tensor types not as asked: {dict(list(wrong.items())[:5])}")
    partial.rename(dst)


def _env(tool: str) -> dict:
    return {**os.environ, "LD_LIBRARY_PATH": str(Path(tool).parent)}


def cost_curves(models: dict[str, Path], rounds: int, threads: int) -> dict[str, list[CostCurve]]:
    """Alternating rounds: every model's curve once per round, so drift hits them alike."""
    from draftwise.backends.llamacpp import LlamaCppBackend

    out: dict[str, list[CostCurve]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, path in models.items():
            backend = LlamaCppBackend(path, n_ctx=1024, n_threads=threads, name=name)
            try:
                out[name].append(measure(backend, POINTS, context_len=256, repeats=3))
            finally:
                backend.close()
    return out


def option_curves(model: Path, rounds: int, threads: int) -> dict[str, list[dict[int, float]]]:
    """The original under llama.cpp context options, timed on the low-level API: n rows with
    logits for all, at 256 tokens of context; median of 3 per n, alternating rounds."""
    from llama_cpp import llama_cpp as C

    options = {
        "default (flash attention off, ubatch 512, f16 KV)": {},
        "flash attention on": {"flash_attn_type": 1},
        "ubatch 32": {"n_ubatch": 32},
        "KV cache q8_0": {"flash_attn_type": 1, "type_k": 8, "type_v": 8},
    }
    C.llama_backend_init()
    mparams = C.llama_model_default_params()
    model_p = C.llama_model_load_from_file(str(model).encode(), mparams)
    vocab = C.llama_model_get_vocab(model_p)
    n_vocab = C.llama_vocab_n_tokens(vocab)
    out: dict[str, list[dict[int, float]]] = {name: [] for name in options}
    try:
        for _ in range(rounds):
            for name, opts in options.items():
                params = C.llama_context_default_params()
                params.n_ctx, params.n_batch, params.n_ubatch = 1024, 512, 512
                params.n_threads = params.n_threads_batch = threads
                for key, value in opts.items():
                    setattr(params, key, value)
                ctx = C.llama_init_from_model(model_p, params)
                try:
                    out[name].append(_time_rows(C, ctx, n_vocab))
                finally:
                    C.llama_free(ctx)
    finally:
        C.llama_model_free(model_p)
    return out


def _time_rows(C, ctx, n_vocab: int, context_len: int = 256) -> dict[int, float]:
    batch = C.llama_batch_init(512, 0, 1)
    mem = C.llama_get_memory(ctx)

    def decode(ids: list[int], start: int, all_logits: bool) -> None:
        batch.n_tokens = len(ids)
        for i, t in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, start + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = all_logits or i == len(ids) - 1
        if C.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    try:
        context = [(7919 * i + 13) % min(n_vocab, 32000) for i in range(context_len)]
        decode(context, 0, False)
        times: dict[int, float] = {}
        for n in POINTS:
            ids = [(104729 * (j + n) + 17) % min(n_vocab, 32000) for j in range(n)]
            samples = []
            for _ in range(3):
                t0 = time.perf_counter()
                decode(ids, context_len, True)
                samples.append(1000 * (time.perf_counter() - t0))
                C.llama_memory_seq_rm(mem, 0, context_len, -1)
            times[n] = statistics.median(samples)
        return times
    finally:
        C.llama_batch_free(batch)


def quality(tool: str, model: Path, text: Path, base: Path, chunks: int, threads: int, make_base: bool) -> dict:
    """llama.cpp's perplexity tool: perplexity, and against the original's saved logits KL
    divergence and top-1 agreement ("Same top p")."""
    args = [
        tool,
        "-m",
        str(model),
        "-f",
        str(text),
        "-c",
        "512",
        "--chunks",
        str(chunks),
        "-t",
        str(threads),
        "--kl-divergence-base",
        str(base),
    ]
    if not make_base:
        args.append("--kl-divergence")
    log = subprocess.run(args, check=True, capture_output=True, text=True, env=_env(tool))
    out = log.stdout + log.stderr

    def grab(pattern: str) -> float | None:
        found = re.search(pattern, out)
        return float(found.group(1)) if found else None

    if make_base:
        return {"ppl": grab(r"Final estimate: PPL = ([\d.]+)")}
    return {
        "ppl": grab(r"Mean PPL\(Q\)\s*:\s*([\d.]+)"),
        "ppl_ratio": grab(r"Mean PPL\(Q\)/PPL\(base\)\s*:\s*([\d.]+)"),
        "kld": grab(r"Mean\s+KLD:\s*([\d.]+)"),
        "kld_99": grab(r"99\.0%\s+KLD:\s*([\d.]+)"),
        "same_top1": grab(r"Same top p:\s*([\d.]+)"),
    }


def greedy_agreement(models: dict[str, Path], max_tokens: int, threads: int) -> dict[str, dict]:
    """Plain greedy decoding of the quick suite's first turns with each model: the share of
    answers identical to the original's, and of tokens before the first difference."""
    from draftwise.bench.suites.prompts import load_suite
    from draftwise.loading import LoadOptions, load_engine
    from draftwise.types import SamplingParams, SpeculationConfig

    prompts = load_suite("quick")
    texts: dict[str, list[list[int]]] = {}
    for name, path in models.items():
        engine = load_engine(str(path), "none", options=LoadOptions(n_ctx=2048, threads=threads))
        try:
            texts[name] = [
                engine.tokenizer.encode(
                    engine.generate(
                        messages=[{"role": "user", "content": p.turns[0]}],
                        sampling=SamplingParams(max_tokens=max_tokens),
                        speculation=SpeculationConfig(enabled=False),
                    ).text,
                    add_special=False,
                )
                for p in prompts
            ]
        finally:
            engine.target.close()
    original = texts["original"]
    out = {}
    for name, answers in texts.items():
        same = [a == b for a, b in zip(answers, original)]
        prefix = [common_prefix_length(a, b) / max(len(b), 1) for a, b in zip(answers, original)]
        out[name] = {"identical": sum(same) / len(same), "mean_prefix_share": float(np.mean(prefix))}
    return out


def ceiling(curve: dict[int, float]) -> tuple[float, int]:
    """The always-right ceiling, as the bench reports it."""
    return always_right_ceiling({str(n): ms for n, ms in curve.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quantize", required=True, help="Path of llama.cpp's llama-quantize.")
    parser.add_argument("--perplexity", required=True, help="Path of llama.cpp's llama-perplexity.")
    parser.add_argument("--work", default="/tmp/draftwise-variants", help="Where variants and logits are kept.")
    parser.add_argument("--out", required=True, help="Output folder: results.json and report.md.")
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=8, help="512-token chunks of the corpus for perplexity.")
    parser.add_argument("--greedy-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--skip-options", action="store_true")
    args = parser.parse_args()

    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    original = resolve(DEFAULT_TARGET)
    names = [n for n, t in tensor_types(original).items() if t == "Q6_K"]
    models = {"original": original}
    for qtype in args.types.split(","):
        dst = work / f"{DEFAULT_TARGET}-q6k-as-{qtype}.gguf"
        build_variant(args.quantize, original, dst, qtype)
        models[qtype] = dst
    text = work / "corpus.txt"
    corpus_sha = corpus(text, max_chars=4 * 512 * (args.chunks + 1))
    results: dict = {
        "target": DEFAULT_TARGET,
        "q6k_tensors": names,
        "threads": args.threads,
        "python": sys.version.split()[0],
        "corpus_sha256": corpus_sha,
        "models": {},
    }
    for name, path in models.items():
        results["models"][name] = {
            "size_mb": round(path.stat().st_size / 2**20, 1),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
        print(name, results["models"][name], flush=True)

    curves = cost_curves(models, args.rounds, args.threads)
    for name, runs in curves.items():
        merged = {n: min(c.ms(n) for c in runs) for n in POINTS}  # the least disturbed of the rounds
        results["models"][name]["cost_ms"] = {n: round(ms, 1) for n, ms in merged.items()}
        results["models"][name]["cost_ms_rounds"] = [{n: round(ms, 1) for n, ms in c.points} for c in runs]
        results["models"][name]["ceiling"] = [round(x, 3) for x in ceiling(merged)]
        print(name, results["models"][name]["cost_ms"], results["models"][name]["ceiling"], flush=True)

    base = work / "original.kld"
    for name, path in models.items():
        results["models"][name]["quality"] = quality(
            args.perplexity, path, text, base, args.chunks, args.threads, make_base=name == "original"
        )
        print(name, results["models"][name]["quality"], flush=True)
    for name, agreement in greedy_agreement(models, args.greedy_tokens, args.threads).items():
        results["models"][name]["greedy"] = agreement
        print(name, agreement, flush=True)
    if not args.skip_options:
        options = option_curves(original, args.rounds, args.threads)
        results["options"] = {}
        for name, runs in options.items():
            merged = {n: min(r[n] for r in runs) for n in POINTS}
            results["options"][name] = {
                "cost_ms": {n: round(ms, 1) for n, ms in merged.items()},
                "ceiling": [round(x, 3) for x in ceiling(merged)],
            }
            print(name, results["options"][name], flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "report.md").write_text(report(results))
    print(report(results))


def report(results: dict) -> str:
    shown = (1, 2, 4, 8, 16, 32, 64)
    orig = results["models"]["original"]
    lines = [
        f"# Verification cost by tensor type ({results['target']}, {results['threads']} threads)",
        "",
        "The default target with its Q6_K tensors ("
        + ", ".join(results["q6k_tensors"][:3])
        + f", ... {len(results['q6k_tensors'])} in all) converted to another type; every other tensor "
        "unchanged. ms for one forward over n rows with logits for every row, at 256 tokens of context "
        "(the lower of alternating rounds). ceiling = best over k of (k + 1) cost(1) / cost(k + 1). "
        "Quality against the original on standard-library sources "
        f"(sha256 {results['corpus_sha256'][:12]}, Python {results['python']}): perplexity ratio, mean KL "
        "divergence, top-1 agreement; greedy = quick-suite answers identical to the original's "
        "(and the mean share of each answer before the first difference).",
        "",
        "| model | MB | " + " | ".join(f"n={n}" for n in shown) + " | ceiling (k) | ceiling vs original | PPL ratio "
        "| KLD | top-1 same | greedy identical |",
        "|---|---|" + "---|" * len(shown) + "---|---|---|---|---|---|",
    ]
    for name, m in results["models"].items():
        q, g = m.get("quality", {}), m.get("greedy", {})
        cost = {int(k): v for k, v in m["cost_ms"].items()}
        lines.append(
            f"| {name} | {m['size_mb']} | "
            + " | ".join(f"{cost[n]:.0f}" for n in shown)
            + f" | {m['ceiling'][0]:.2f}x ({m['ceiling'][1]}) | {m['ceiling'][0] / orig['ceiling'][0]:.2f}x"
            + f" | {q.get('ppl_ratio') or 1.0:.4f} | {q.get('kld') or 0.0:.4f} | {q.get('same_top1') or 100.0:.1f}%"
            + f" | {g.get('identical', 0):.0%} ({g.get('mean_prefix_share', 0):.0%}) |"
        )
    if results.get("options"):
        lines += [
            "",
            "The original under llama.cpp context options (same timing, low-level API):",
            "",
            "| option | " + " | ".join(f"n={n}" for n in shown) + " | ceiling (k) |",
            "|---|" + "---|" * len(shown) + "---|",
        ]
        for name, o in results["options"].items():
            cost = {int(k): v for k, v in o["cost_ms"].items()}
            lines.append(
                f"| {name} | "
                + " | ".join(f"{cost[n]:.0f}" for n in shown)
                + f" | {o['ceiling'][0]:.2f}x ({o['ceiling'][1]}) |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
