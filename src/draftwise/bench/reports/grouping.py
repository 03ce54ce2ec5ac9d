"""How bench records group and aggregate: a method's label, a setting (temperature x context),
per-category rows, and the geometric mean; markdown tables. The report's sections, the plots and
the console tables all read records through these.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from draftwise.bench.suites.prompts import CATEGORIES

TABLE_HEADERS = (
    "category",
    "method",
    "n",
    "tok/s",
    "speedup",
    "drift-corr.",
    "acceptance",
    "tokens/step",
    "identical",
    "mem overhead MB",
    "errors",
)


def variant_label(record: dict) -> str:
    """'baseline', 'ngram k=4', 'draft k=4 dT=0.7'."""
    label = record["method"]
    # NOTE: the auto policy chooses k itself (0..64), so its --k value says nothing.
    if record.get("k") is not None and record.get("policy", "") != "auto" and not label.startswith("auto"):
        label += f" k={record['k']}"
    if record.get("draft_temperature") is not None:
        label += f" dT={record['draft_temperature']:g}"
    if (record.get("branches") or 1) > 1:
        label += f" b={record['branches']}"
    return label


def setting_of(record: dict) -> tuple[float, int | None]:
    return (float(record["temperature"]), record.get("context_tokens"))


def setting_label(setting: tuple[float, int | None]) -> str:
    temperature, ctx = setting
    text = "greedy (T=0)" if temperature == 0 else f"T={temperature:g}"
    return text + (f", context padded to ~{ctx} tokens" if ctx else "")


def geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def variant_order(records: Sequence[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for r in records:
        seen.setdefault(variant_label(r), None)
    return sorted(seen, key=lambda v: (v != "baseline", list(seen).index(v)))


def category_order(records: Sequence[dict]) -> list[str]:
    present = {r["category"] for r in records}
    return [c for c in CATEGORIES if c in present] + sorted(present - set(CATEGORIES))


def aggregate(records: Sequence[dict]) -> dict:
    """Summary numbers of a group of records (one category x variant, say)."""
    ok = [r for r in records if not r.get("error")]
    drafted = sum(r["num_drafted"] for r in ok)
    steps = sum(r["num_steps"] for r in ok)
    same = [r["identical_to_baseline"] for r in ok if r.get("identical_to_baseline") is not None]
    overhead = [r["memory_overhead_mb"] for r in records if r.get("memory_overhead_mb") is not None]
    return {
        "n": len(ok),
        "errors": len(records) - len(ok),
        "tokens_per_second": sum(r["decode_tokens_per_second"] for r in ok) / len(ok) if ok else None,
        "speedup": geomean(r.get("speedup") for r in ok),
        "speedup_drift_corrected": geomean(r.get("speedup_drift_corrected") for r in ok),
        "acceptance_rate": sum(r["num_accepted"] for r in ok) / drafted if drafted else None,
        "tokens_per_step": sum(r["num_generated"] + r.get("num_eos", 0) for r in ok) / steps if steps else None,
        "identical": sum(same) / len(same) if same else None,
        "memory_overhead_mb": max(overhead) if overhead else None,
    }


def category_rows(records: Sequence[dict]) -> list[tuple]:
    """Rows of the per-category x method table (one setting), ending with 'all' rows per method."""
    by_key: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in records:
        by_key[(r["category"], variant_label(r))].append(r)
    variants = variant_order(records)
    rows = []
    for category in [*category_order(records), "all"]:
        for variant in variants:
            group = (
                [r for r in records if variant_label(r) == variant]
                if category == "all"
                else by_key.get((category, variant))
            )
            if group:
                rows.append((category, variant, *format_aggregate(aggregate(group))))
    return rows


def format_aggregate(a: dict) -> tuple:
    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    return (
        str(a["n"]),
        num(a["tokens_per_second"], ".1f"),
        "-" if a["speedup"] is None else f"{a['speedup']:.2f}x",
        "-" if a.get("speedup_drift_corrected") is None else f"{a['speedup_drift_corrected']:.2f}x",
        num(a["acceptance_rate"], ".0%"),
        num(a["tokens_per_step"], ".2f"),
        num(a["identical"], ".0%"),
        "-" if a["memory_overhead_mb"] is None else f"{a['memory_overhead_mb']:+.0f}",
        str(a["errors"]),
    )


def by_setting(records: Sequence[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[setting_of(r)].append(r)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)))


def stability(records: Sequence[dict]) -> dict[str, dict]:
    """Per variant: tokens/s in the first and last window, and late/early (second half over first half)."""
    out = {}
    for variant in variant_order(records):
        series = [
            [w for w in r.get("tokens_per_second_windows") or [] if w]
            for r in records
            if variant_label(r) == variant and not r.get("error")
        ]
        series = [s for s in series if len(s) >= 2]
        if not series:
            continue
        ratios = [
            (sum(s[len(s) // 2 :]) / len(s[len(s) // 2 :])) / (sum(s[: len(s) // 2]) / len(s[: len(s) // 2]))
            for s in series
        ]
        out[variant] = {
            "n": len(series),
            "first": sum(s[0] for s in series) / len(series),
            "last": sum(s[-1] for s in series) / len(series),
            "late_over_early": geomean(ratios),
            "windows": max(len(s) for s in series),
        }
    return out


def headline_speedups(group: Sequence[dict]) -> list[tuple[str, float | None]]:
    """(variant, geometric-mean speedup over its records) for each method but the baseline."""
    return [
        (variant, geomean(r.get("speedup") for r in group if variant_label(r) == variant and not r.get("error")))
        for variant in variant_order(group)
        if variant != "baseline"
    ]


STABILITY_HEADERS = ("method", "prompts", "windows", "first window tok/s", "last window tok/s", "late/early")


def stability_note(group: Sequence[dict]) -> str:
    return (
        f"Speed over the output (windows of {group[0].get('window_tokens', 32)} tokens; late/early = "
        "mean tok/s of the second half of the windows / the first half, geometric mean over prompts):"
    )


def stability_rows(group: Sequence[dict]) -> list[tuple]:
    """Per variant: prompts, windows, first and last window tok/s, late/early (stability above)."""
    return [
        (v, s["n"], s["windows"], f"{s['first']:.1f}", f"{s['last']:.1f}", f"{s['late_over_early']:.2f}")
        for v, s in stability(group).items()
    ]


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
