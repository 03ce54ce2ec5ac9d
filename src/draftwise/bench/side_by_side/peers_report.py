"""The side-by-side run's report: per suite and per category, each server's decode speed as a ratio to
the baseline server's on the same prompt (geometric mean and minimum over the prompts), the checks
that make the ratios fair (prompt token counts equal, requests that failed, identical answers) and
how busy the host was; `write_outputs` writes results.json and report.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from draftwise.bench.reports.report_header import COMPETING_SHARE

HOW_MEASURED = (
    "Each prompt went to every server in turn, one request at a time, the servers' order rotated by one "
    "from prompt to prompt: a streamed greedy chat completion (temperature 0, the server's chat template). "
    "Decode speed is the server's own timings (predicted_n over predicted_ms, as llama-server and draftwise "
    "serve both report them; where a server reports none, completion tokens - 1 over the time from the first "
    "content to the last); a ratio "
    "is a server's decode speed over the baseline's on the same prompt, and a cell gives their geometric mean "
    "over the prompts and the smallest (min). The baseline's cell gives its own speed (geometric mean, tok/s)."
)


def _geomean(values: Sequence[float]) -> float | None:
    """[1.0, 4.0] -> 2.0; None for no values."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _by_prompt(records: Sequence[dict]) -> dict[tuple, dict[str, dict]]:
    """(suite, category, question_id) -> server -> its record, in the run's order."""
    out: dict[tuple, dict[str, dict]] = {}
    for r in records:
        out.setdefault((r["suite"], r["category"], r["question_id"]), {})[r["server"]] = r
    return out


def ratio_cells(records: Sequence[dict], servers: Sequence[str], baseline: str) -> dict[str, dict]:
    """Per server: geomean and min of its decode speed over the baseline's, prompt by prompt, over the
    prompts both answered (num), and the geomean of its own decode tok/s over those it answered.

    Example: a at 10 and 20 tok/s, b at 20 and 30 on the same two prompts, baseline a -> b's geomean
    sqrt(2 * 1.5) = 1.73, min 1.5, num 2.
    """
    cells = {}
    prompts = _by_prompt(records).values()
    for name in servers:
        own = [
            p[name]["decode_tokens_per_second"] for p in prompts if (p.get(name) or {}).get("decode_tokens_per_second")
        ]
        ratios = [
            p[name]["decode_tokens_per_second"] / p[baseline]["decode_tokens_per_second"]
            for p in prompts
            if (p.get(name) or {}).get("decode_tokens_per_second")
            and (p.get(baseline) or {}).get("decode_tokens_per_second")
        ]
        cells[name] = {
            "geomean": _geomean(ratios),
            "min": min(ratios) if ratios else None,
            "num": len(ratios),
            "tokens_per_second": _geomean(own),
        }
    return cells


def ratio_rows(results: dict) -> list[dict]:
    """One row per suite and, for a suite of several categories, one per category (kind "category")."""
    meta, records = results["meta"], results["records"]
    servers, baseline = [s["name"] for s in meta["servers"]], meta["baseline"]
    rows = []
    for suite in meta["suites"]:
        mine = [r for r in records if r["suite"] == suite["name"]]
        categories = list(dict.fromkeys(r["category"] for r in mine))
        per_category = [
            {
                "suite": suite["name"],
                "category": c,
                "kind": "category",
                "cells": ratio_cells([r for r in mine if r["category"] == c], servers, baseline),
            }
            for c in categories
        ]
        rows.append(
            {
                "suite": suite["name"],
                "category": None,
                "kind": "suite",
                "cells": ratio_cells(mine, servers, baseline),
                "by_category": per_category if len(categories) > 1 else [],
            }
        )
        rows += per_category if len(categories) > 1 else []
    return rows


def _cell(cell: dict, is_baseline: bool, ranges: Sequence[dict] = ()) -> str:
    """'1.51x (min 0.90)', the baseline's '1.00 (28.3 tok/s)', a suite of categories' '0.67-0.84x by category'."""
    if not cell["num"] and not (is_baseline and cell["tokens_per_second"]):
        return "-"
    if is_baseline:
        speeds = [c["tokens_per_second"] for c in ranges if c["tokens_per_second"]]
        if speeds:
            return f"1.00 ({min(speeds):.0f}-{max(speeds):.0f} tok/s)"
        return f"1.00 ({cell['tokens_per_second']:.1f} tok/s)"
    means = [c["geomean"] for c in ranges if c["geomean"] is not None]
    if means:
        return f"{min(means):.2f}-{max(means):.2f}x by category (all {cell['geomean']:.2f}x, min {cell['min']:.2f})"
    return f"{cell['geomean']:.2f}x (min {cell['min']:.2f})"


def ratio_table(results: dict) -> str:
    """The markdown table: a row per suite (a category range where it has several), servers as columns,
    the best geomean of each row in bold."""
    servers, baseline = [s["name"] for s in results["meta"]["servers"]], results["meta"]["baseline"]
    suites = {s["name"]: s for s in results["meta"]["suites"]}
    lines = ["| suite | " + " | ".join(servers) + " |", "|---" * (len(servers) + 1) + "|"]
    for row in (r for r in ratio_rows(results) if r["kind"] == "suite"):
        cells = row["cells"]
        best = max(
            (n for n in servers if cells[n]["geomean"] is not None), key=lambda n: cells[n]["geomean"], default=None
        )
        texts = []
        for name in servers:
            ranges = [c["cells"][name] for c in row["by_category"]]
            text = _cell(cells[name], name == baseline, ranges)
            texts.append(f"**{text}**" if name == best and name != baseline and cells[name]["geomean"] > 1 else text)
        suite = suites[row["suite"]]
        num = suite["num_prompts"]
        label = f"{row['suite']}, {num} prompt{'s' * (num != 1)}, {suite['max_tokens']} tokens"
        lines.append(f"| {label} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def category_table(results: dict) -> str | None:
    """Per category of the suites that have several: the same cells. None when no suite has several."""
    servers, baseline = [s["name"] for s in results["meta"]["servers"]], results["meta"]["baseline"]
    rows = [r for r in ratio_rows(results) if r["kind"] == "category"]
    if not rows:
        return None
    lines = ["| suite | category | " + " | ".join(servers) + " |", "|---" * (len(servers) + 2) + "|"]
    for row in rows:
        texts = [_cell(row["cells"][n], n == baseline) for n in servers]
        lines.append(f"| {row['suite']} | {row['category']} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def checks(results: dict) -> dict:
    """What makes the ratios fair, counted: prompts whose token counts differ between servers (the chat
    templates or tokenizers differ), failed requests, answers identical to the baseline's, drafting, and the
    CPU share other processes took per prompt."""
    baseline = results["meta"]["baseline"]
    prompts = _by_prompt(results["records"])
    mismatched = [
        {"prompt": list(key), "prompt_tokens": {n: r["prompt_tokens"] for n, r in by.items()}}
        for key, by in prompts.items()
        if len({r["prompt_tokens"] for r in by.values() if r["ok"]}) > 1
    ]
    failed = [r for r in results["records"] if not r["ok"]]
    same = {}
    for name in {r["server"] for r in results["records"]} - {baseline}:
        pairs = [(by[name], by[baseline]) for by in prompts.values() if name in by and baseline in by]
        pairs = [(a, b) for a, b in pairs if a["ok"] and b["ok"]]
        same[name] = [sum(a["text_sha1"] == b["text_sha1"] for a, b in pairs), len(pairs)]
    shares = [r["other_cpu_share"] for r in results["records"] if r.get("other_cpu_share") is not None]
    return {
        "num_prompts": len(prompts),
        "prompt_tokens_mismatched": mismatched,
        "num_failed": len(failed),
        "failed": [f"{r['server']} on {r['suite']} {r['question_id']}: {r['status']}: {r['error']}" for r in failed],
        "identical_to_baseline": same,
        "other_cpu_share": [min(shares), max(shares)] if shares else None,
    }


def markdown(results: dict) -> str:
    meta, found = results["meta"], checks(results)
    host = meta.get("host", {})
    out = [
        "# draftwise bench-serve: servers side by side",
        "",
        f"Host: {host.get('cpu') or host.get('machine', '?')} ({host.get('cpus', '?')} CPUs, "
        f"{host.get('isa') or 'no AVX'}); {meta.get('started_at', '?')} to {meta.get('finished_at', '?')}. "
        f"Baseline: `{meta['baseline']}`.",
        "",
        HOW_MEASURED,
        "",
        ratio_table(results),
        "",
    ]
    if (table := category_table(results)) is not None:
        out += ["By category:", "", table, ""]
    out += _check_lines(found, meta["baseline"]) + ["", "Servers:", ""]
    for s in meta["servers"]:
        out.append(
            f"- `{s['name']}`: {s['url']}, model `{s['model']}`" + (f"; `{s['command']}`" if s.get("command") else "")
        )
    if meta.get("command"):
        out += ["", f"Command: `{meta['command']}`"]
    return "\n".join(out) + "\n"


def _check_lines(found: dict, baseline: str) -> list[str]:
    n = found["num_prompts"]
    mismatched = found["prompt_tokens_mismatched"]
    lines = [
        f"- Prompt token counts equal on every server: {n - len(mismatched)} of {n} prompts"
        + (
            "."
            if not mismatched
            else " — **they differ on "
            + ", ".join(f"{m['prompt'][0]} {m['prompt'][2]} {m['prompt_tokens']}" for m in mismatched[:5])
            + "**: the servers did not read the same tokens."
        ),
        f"- Failed requests: {found['num_failed']}"
        + ("." if not found["failed"] else ": " + "; ".join(found["failed"][:5]) + "."),
    ]
    if found["identical_to_baseline"]:
        lines.append(
            f"- Answers identical to `{baseline}`'s: "
            + ", ".join(f"`{name}` {a} of {b}" for name, (a, b) in sorted(found["identical_to_baseline"].items()))
            + "."
        )
    if found["other_cpu_share"]:
        low, high = found["other_cpu_share"]
        lines.append(
            "- CPU time other processes took (not the bench, not the servers it started), per prompt: "
            f"{low:.0%}-{high:.0%} of the machine"
            + (
                f" — **over {COMPETING_SHARE:.0%}: the timings are noisy; rerun on a quiet machine**."
                if high > COMPETING_SHARE
                else "."
            )
        )
    return lines


def write_outputs(results: dict, out: Path) -> Path:
    """results.json and report.md in out; returns report.md's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    report = out / "report.md"
    report.write_text(markdown(results))
    return report
