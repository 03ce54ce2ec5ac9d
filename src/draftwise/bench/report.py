"""The bench report: results.json -> report.md (per-category x method tables) and PNG plots.

Aggregates (bench.grouping): decode tokens/s is a mean over records, speedup a geometric mean of
per-prompt ratios, acceptance and tokens/step are pooled (sums over records), so long outputs
weigh more. The later sections are bench.report_sections', the plots bench.plots'.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from draftwise.bench import plots as bench_plots
from draftwise.bench.grouping import (
    TABLE_HEADERS,
    by_setting,
    category_rows,
    geomean,
    markdown_table,
    setting_label,
    stability,
    variant_label,
    variant_order,
)
from draftwise.bench.report_sections import ACCOUNT_PARTS, SECTIONS, time_account_rows

# What other modules and scripts read from the report (defined in its parts).
__all__ = [
    "ACCOUNT_PARTS",
    "HOW_MEASURED",
    "TABLE_HEADERS",
    "always_right_ceiling",
    "by_setting",
    "category_rows",
    "geomean",
    "markdown_table",
    "render_markdown",
    "setting_label",
    "time_account_rows",
    "variant_label",
    "write_report",
]

HOW_MEASURED = (
    "**How measured.** tok/s = generated tokens / decode time (prefill excluded), mean over prompts. Before each "
    "prompt a short warm-up per drafter puts the prompt in every cache, then the methods run back to back on it, "
    "so drift cancels and all start alike (the cold prompt cost is in results.json as cold_prefill_ms and, for a "
    "draft model, cold_draft_ms). speedup = a method's tok/s / the same prompt and turn's baseline tok/s, geometric "
    "mean. drift-corr. = the same, with each run's time counted in its own plain-step time (steps that drafted "
    "nothing), so the machine speeding up or slowing down between runs cancels; '-' where a run had under 8 plain "
    "steps. acceptance = accepted / drafted draft tokens and tokens/step = generated tokens / target forwards, both "
    "pooled over prompts. identical = greedy output token-for-token equal to baseline. Later turns of a "
    "conversation continue from the baseline's answers, so every method gets the same next task. mem overhead = "
    "resident memory with the draft model loaded and used minus without it. Tokens/s over the output comes from the "
    "times at which streamed text arrived."
)
# A run in which other processes took more than this share of the machine's CPU time is noisy.
COMPETING_SHARE = 0.15


def render_markdown(results: dict, plots: Sequence[str] = ()) -> str:
    records, meta = results.get("records", []), results.get("meta", {})
    out = _header(results)
    for setting, group in by_setting(records).items():
        out += _setting_section(setting, group)
    for section in SECTIONS:
        out += section(records, meta)
    if plots:
        out += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    return "\n".join(out)


def _header(results: dict) -> list[str]:
    """The title, what ran on what, how it was measured, the calibration and how busy the host was."""
    records = results.get("records", [])
    config, meta = results.get("config", {}), results.get("meta", {})
    out = ["# draftwise bench report", ""]
    target = meta.get("target", "?")
    out.append(
        f"Target `{target}`"
        + (f", draft model `{meta['draft_model']}`" if meta.get("draft_model") else "")
        + f"; drafters loaded: {', '.join(meta.get('drafters', [])) or 'none'}; prompts: {meta.get('prompts', '?')}."
    )
    out.append(
        f"Methods {', '.join(config.get('methods', []))}; max_tokens {config.get('max_tokens')}; "
        f"k {config.get('ks')}; "
        + (f"branches {config.get('branches')}; " if (config.get("branches") or [1]) != [1] else "")
        + f"repeats {config.get('repeats')} (median kept); "
        f"{len(records)} records{'' if results.get('complete') else ' (run incomplete)'}."
    )
    out += ["", HOW_MEASURED, ""]
    if meta.get("calibration_ms"):
        out += [
            f"The cost curves were calibrated at load, before any run: {meta['calibration_ms'] / 1000:.0f} s, "
            "in no timing above or below.",
            "",
        ]
    ceiling = always_right_ceiling(meta.get("calibration", {}).get("target"))
    if ceiling:
        out += [
            f"Always-right ceiling from this run's calibration: **{ceiling[0]:.2f}x** at k = {ceiling[1]} (a drafter "
            "whose every token is accepted, at no drafting cost: best over k of (k+1)·cost(1)/cost(k+1)).",
            "",
        ]
    return out + _competing_note(records)


def _competing_note(records: Sequence[dict]) -> list[str]:
    other = [r["other_cpu_share"] for r in records if r.get("other_cpu_share") is not None]
    if not other:
        return []
    busy = [x for x in other if x > COMPETING_SHARE]
    return [
        f"CPU time taken by other processes during the runs: {min(other):.0%}–{max(other):.0%} of the machine"
        + (
            f" — **other processes competed for the CPU in {len(busy)} of {len(other)} runs (over "
            f"{COMPETING_SHARE:.0%}), so timings are noisy; rerun on a quiet machine before drawing "
            "conclusions**."
            if busy
            else "."
        ),
        "",
    ]


def _setting_section(setting: tuple, group: Sequence[dict]) -> list[str]:
    """One temperature x context: the headline speedups, the category table, speed over the output."""
    out = [f"## {setting_label(setting)}", ""]
    headline = []
    for variant in variant_order(group):
        if variant == "baseline":
            continue
        g = geomean(r.get("speedup") for r in group if variant_label(r) == variant and not r.get("error"))
        headline.append(f"{variant} **{g:.2f}x**" if g else f"{variant} -")
    if headline:
        out += ["Overall geometric-mean speedup vs baseline: " + ", ".join(headline) + ".", ""]
    out += [markdown_table(TABLE_HEADERS, category_rows(group)), ""]
    stab = stability(group)
    if not stab:
        return out
    out += [
        (
            f"Speed over the output (windows of {group[0].get('window_tokens', 32)} tokens; late/early = "
            "mean tok/s of the second half of the windows / the first half, geometric mean over prompts):"
        ),
        "",
    ]
    rows = [
        (v, s["n"], s["windows"], f"{s['first']:.1f}", f"{s['last']:.1f}", f"{s['late_over_early']:.2f}")
        for v, s in stab.items()
    ]
    headers = ("method", "prompts", "windows", "first window tok/s", "last window tok/s", "late/early")
    return out + [markdown_table(headers, rows), ""]


def always_right_ceiling(curve: dict | None) -> tuple[float, int] | None:
    """(speedup, k) of a free drafter that is always right, from a calibration {n: ms}.

    Example: {"1": 30, "2": 45, "4": 60} -> (2.0, 3): four tokens for the price of two steps.
    """
    if not curve or "1" not in curve:
        return None
    from draftwise.calibrate import CostCurve

    cost = CostCurve.from_points(curve)
    ratios = [((k + 1) * cost.ms(1) / cost.ms(k + 1), k) for k in range(1, cost.max_n) if cost.ms(k + 1) > 0]
    return max(ratios) if ratios and cost.ms(1) > 0 else None


def write_report(results: dict, out_dir: str | Path) -> Path:
    """Write report.md and the PNG plots next to it; returns the report's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = results.get("records", [])
    plots = [
        bench_plots.plot_speedup_by_category(records, out_dir / "speedup_by_category.png"),
        bench_plots.plot_tokens_per_second_over_output(records, out_dir / "tokens_per_second_over_output.png"),
        bench_plots.plot_acceptance_by_position(records, out_dir / "acceptance_by_position.png"),
        bench_plots.plot_cost_curve(records, results.get("meta", {}), out_dir / "cost_curve.png"),
        bench_plots.plot_context_sweep(records, out_dir / "context_sweep.png"),
    ]
    path = out_dir / "report.md"
    path.write_text(render_markdown(results, [str(p) for p in plots if p is not None]))
    return path
