"""The bench report: results.json -> report.md (per-category x method tables) and PNG plots.

Aggregates (bench.reports.grouping): decode tokens/s is a mean over records, speedup a geometric mean of
per-prompt ratios, acceptance and tokens/step are pooled (sums over records), so long outputs
weigh more. The header is bench.reports.report_header's, the later sections bench.reports.report_sections', the
plots bench.reports.plots', the HTML page bench.reports.report_html's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from draftwise.bench.reports import long_context, report_html
from draftwise.bench.reports import plots as bench_plots
from draftwise.bench.reports.grouping import (
    STABILITY_HEADERS,
    TABLE_HEADERS,
    by_setting,
    category_rows,
    geomean,
    headline_speedups,
    markdown_table,
    setting_label,
    stability_note,
    stability_rows,
    variant_label,
)
from draftwise.bench.reports.report_header import HOW_MEASURED, always_right_ceiling, header_lines
from draftwise.bench.reports.report_sections import ACCOUNT_PARTS, SECTIONS, time_account_rows

# What other modules and scripts read from the report (defined in its parts).
__all__ = [
    "ACCOUNT_PARTS",
    "HOW_MEASURED",
    "HTML_NAME",
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

HTML_NAME = "report.html"  # beside report.md


def render_markdown(results: dict, plots: Sequence[str] = ()) -> str:
    records, meta = results.get("records", []), results.get("meta", {})
    out = header_lines(results)
    for setting, group in by_setting(records).items():
        out += _setting_section(setting, group)
    for section in SECTIONS:
        out += section(records, meta)
    if plots:
        out += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    return "\n".join(out)


def _setting_section(setting: tuple, group: Sequence[dict]) -> list[str]:
    """One temperature x context: the headline speedups, the category table, speed over the output."""
    out = [f"## {setting_label(setting)}", ""]
    headline = [f"{variant} **{g:.2f}x**" if g else f"{variant} -" for variant, g in headline_speedups(group)]
    if headline:
        out += ["Overall geometric-mean speedup vs baseline: " + ", ".join(headline) + ".", ""]
    out += [markdown_table(TABLE_HEADERS, category_rows(group)), ""]
    rows = stability_rows(group)
    if not rows:
        return out
    return out + [stability_note(group), "", markdown_table(STABILITY_HEADERS, rows), ""]


def write_report(results: dict, out_dir: str | Path) -> Path:
    """Write report.md, the PNG plots and report.html (bench.reports.report_html: the same tables, the
    plots inline, the recorded answers' token sources) next to it; returns report.md's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = results.get("records", [])
    plots = [
        bench_plots.plot_speedup_by_category(records, out_dir / "speedup_by_category.png"),
        bench_plots.plot_tokens_per_second_over_output(records, out_dir / "tokens_per_second_over_output.png"),
        bench_plots.plot_acceptance_by_position(records, out_dir / "acceptance_by_position.png"),
        bench_plots.plot_cost_curve(records, results.get("meta", {}), out_dir / "cost_curve.png"),
        bench_plots.plot_context_sweep(records, out_dir / "context_sweep.png"),
        long_context.plot_long_context(records, out_dir / "long_context.png"),
        long_context.plot_long_outputs(records, out_dir / "long_outputs.png"),
    ]
    written = [p for p in plots if p is not None]
    path = out_dir / "report.md"
    path.write_text(render_markdown(results, [str(p) for p in written]))
    (out_dir / HTML_NAME).write_text(report_html.render_html(results, written), encoding="utf-8")
    return path
