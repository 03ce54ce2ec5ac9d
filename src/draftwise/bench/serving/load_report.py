"""The bench-serve report: results.json, report.md (one row per concurrency level), throughput.png,
and the side-by-side table of several runs (`compare_markdown`, e.g. draftwise vs llama-server).
A soak (`bench-serve --duration`) adds its verdict to report.md and rss.png, the server's RSS over time.

Plots use matplotlib's object API (no pyplot global state), as report.py does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from draftwise.bench.reports.grouping import markdown_table
from draftwise.bench.serving.load import FORMAT
from draftwise.types import ConfigError

LEVEL_HEADERS = (
    "C",
    "requests",
    "errors",
    "tok/s (all)",
    "tok/s per request p50",
    "TTFT p50 s",
    "TTFT p95 s",
    "latency p50 s",
    "latency p95 s",
    "latency max s",
    "acceptance",
)
HOW_MEASURED = (
    "**How measured.** At each level C clients take the next prompt (the first turn of each suite record, cycled) "
    "from a shared queue until the level's requests are done; each is a streaming chat completion at temperature 0. "
    "TTFT = time from sending a request to its first non-empty content delta; latency = to the end of its stream. "
    "tok/s (all) = completion tokens of the successful requests / the level's wall time (first request sent to last "
    "stream ended); tok/s per request = a request's completion tokens / its latency. Completion tokens come from the "
    "final usage chunk, else one per content delta. Percentiles (linear interpolation) are over successful requests; "
    "errors are non-200 answers, error events and streams that end before [DONE]. One unrecorded warm-up request "
    "runs first; every level sends the same prompts in the same order. acceptance = accepted / drafted tokens summed "
    "over usage.speculative, where the server reports it."
)


SOAK_MEASURED = (
    "**How measured.** For the soak's duration C clients each send one streaming chat completion after another "
    "(temperature 0), going through the prompts in their own seeded shuffled order; a request in flight when the "
    "time is up finishes. A prompt with its own max_tokens uses it. RSS is the resident memory of the server process "
    "and its children (psutil), sampled from the soak's start (after one unrecorded warm-up request) at the given "
    "interval and once at the end. The reference is the first sample at or after the warm-up window; the deviations "
    "are the largest and smallest later sample against it. **flat** = every sample from the warm-up window on is "
    "within {tolerance:g}% of the reference; **passed** = flat and no failed request."
)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def level_rows(results: dict) -> list[tuple]:
    """One row of LEVEL_HEADERS per concurrency level."""
    rows = []
    for s in results["levels"]:
        acceptance = s["num_accepted"] / s["num_drafted"] if s.get("num_drafted") else None
        rows.append(
            (
                s["concurrency"],
                s["num_requests"],
                s["num_errors"],
                _num(s["tokens_per_second"], ".1f"),
                _num(s["request_tokens_per_second_p50"], ".1f"),
                _num(s["ttft_p50_s"], ".3f"),
                _num(s["ttft_p95_s"], ".3f"),
                _num(s["latency_p50_s"], ".2f"),
                _num(s["latency_p95_s"], ".2f"),
                _num(s["latency_max_s"], ".2f"),
                _num(acceptance, ".0%"),
            )
        )
    return rows


def level_table(results: dict) -> str:
    """The Markdown table of report.md: LEVEL_HEADERS, one row per level."""
    return markdown_table(LEVEL_HEADERS, level_rows(results))


def run_label(results: dict) -> str:
    meta = results["meta"]
    return meta.get("label") or meta["server"]["url"]


def span(seconds: float) -> str:
    """A duration for the report: 1800 -> '30 min', 90 -> '1.5 min', 4.2 -> '4.2 s'."""
    return f"{seconds / 60:.3g} min" if seconds >= 60 else f"{seconds:.2g} s"


def verdict_word(value: bool | None, no: str = "no") -> str:
    return "-" if value is None else ("yes" if value else no)


def soak_lines(results: dict) -> list[str]:
    """The soak section of report.md: the verdict table, how it was measured and the RSS plot."""
    soak = results["soak"]
    s = soak["summary"]
    warm = f"{s['rss_warm_mb']:.0f} MiB at {span(s['rss_warm_t_s'])}" if s["rss_warm_mb"] is not None else "-"
    rows = [
        ("requests done", s["num_ok"]),
        ("failed requests", s["num_errors"]),
        (f"RSS at the end of the warm-up window ({span(s['warm_s'])})", warm),
        ("RSS at the end", _num(s["rss_end_mb"], ".0f") + (" MiB" if s["rss_end_mb"] is not None else "")),
        (
            "largest deviation after warm-up",
            _num(s["rss_max_dev_pct"], "+.1f") + "%" * (s["rss_max_dev_pct"] is not None),
        ),
        (
            "smallest deviation after warm-up",
            _num(s["rss_min_dev_pct"], "+.1f") + "%" * (s["rss_min_dev_pct"] is not None),
        ),
        ("RSS samples (after warm-up)", f"{s['num_samples']} ({s['num_samples_after_warm']})"),
        (f"flat (within {s['tolerance_pct']:g}%)", verdict_word(s["flat"], "**no**")),
        ("passed", verdict_word(s["passed"], "**no**")),
    ]
    lines = ["## Soak", "", markdown_table(("", "value"), rows), ""]
    if soak.get("server_pid") is None:
        lines += ["RSS not sampled: the server was given by --url without --server-pid.", ""]
    elif soak.get("rss_error"):
        lines += [f"RSS sampling stopped: {soak['rss_error']}.", ""]
    elif s["flat"] is None:
        lines += ["No verdict on RSS: fewer than two samples from the end of the warm-up window on.", ""]
    lines += [SOAK_MEASURED.format(tolerance=s["tolerance_pct"]), "", "![](rss.png)"]
    return lines


def render_markdown(results: dict) -> str:
    meta = results["meta"]
    started = f" (started as `{meta['serve_command']}`)" if meta.get("serve_command") else ""
    soak = results.get("soak")
    if soak:
        what = (
            f"a soak of {span(soak['duration_s'])} at C={soak['concurrency']} ({meta['num_requests']} requests, "
            f"seed {soak['seed']}), max_tokens {meta['max_tokens']} unless a prompt sets its own"
        )
    else:
        what = f"{meta['num_requests']} requests per level, max_tokens {meta['max_tokens']}"
    lines = [
        f"# draftwise bench-serve: {run_label(results)}",
        "",
        f"Server {meta['server']['url']}{started}, model `{meta['model']}`; prompts: {meta.get('prompts', '?')}; "
        f"{what}; finished {meta['finished_at']}.",
        "",
        level_table(results),
        "",
        HOW_MEASURED if not soak else "Columns as in the level runs: tok/s, TTFT and latency over the whole soak.",
        "",
        "![](throughput.png)",
    ]
    if soak:
        lines += ["", *soak_lines(results)]
    errors = [
        (s["concurrency"], n, message.replace("|", "/"))
        for s in results["levels"]
        for message, n in s["errors"].items()
    ]
    if errors:
        lines += ["", "## Errors", "", markdown_table(("C", "count", "error"), errors)]
    return "\n".join(lines) + "\n"


def plot_rss(results: dict, path: Path) -> Path:
    """A soak's server RSS over time, with each request's completion marked (failed ones in red) and the
    warm-up window and the flat band shaded."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    soak = results["soak"]
    summary = soak["summary"]
    fig = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    samples = soak["samples"]
    if samples:
        ax.plot([t / 60 for t, _ in samples], [mb for _, mb in samples], marker=".", label="server RSS")
    ref = summary["rss_warm_mb"]
    if ref is not None:
        tol = summary["tolerance_pct"] / 100
        ax.axhspan(ref * (1 - tol), ref * (1 + tol), color="tab:green", alpha=0.12, label=f"±{tol:.0%} of warm RSS")
    ax.axvspan(0, summary["warm_s"] / 60, color="grey", alpha=0.12, label="warm-up window")
    done = [(r["started_s"] + r["latency_s"], r["ok"]) for r in results["records"] if r.get("started_s") is not None]
    for ok, y, color, name in ((True, 0.04, "tab:blue", "request done"), (False, 0.1, "tab:red", "request failed")):
        ts = [t / 60 for t, good in done if good is ok]
        if ts:  # NOTE: along the bottom of the axes (x in minutes, y a fraction of the height)
            ax.plot(ts, [y] * len(ts), "|", color=color, markersize=12, label=name, transform=ax.get_xaxis_transform())
    ax.set_xlabel("minutes from the soak's start")
    ax.set_ylabel("RSS, MiB" if samples else "RSS not sampled")
    ax.set_title(f"Server memory during the soak: {run_label(results)}")
    ax.legend(fontsize="small", loc="best")
    fig.savefig(path, dpi=110)
    return path


def plot_levels(results: dict, path: Path) -> Path:
    """Two panels over C: aggregate completion tokens/s, and TTFT p50/p95."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    levels = results["levels"]
    cs = [s["concurrency"] for s in levels]
    fig = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    left.plot(cs, [s["tokens_per_second"] or 0.0 for s in levels], marker="o")
    left.set_ylabel("completion tokens/s, all requests")
    for q, style in (("p50", "--"), ("p95", "-")):
        right.plot(cs, [s[f"ttft_{q}_s"] or 0.0 for s in levels], style, marker="o", label=f"TTFT {q}")
    right.set_ylabel("seconds")
    right.legend(fontsize="small")
    for ax, title in ((left, "Aggregate throughput"), (right, "Time to first token")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_xlabel("concurrent clients")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{title}: {run_label(results)}")
    fig.savefig(path, dpi=110)
    return path


def write_outputs(results: dict, out_dir: str | Path) -> Path:
    """results.json, report.md and throughput.png (and a soak's rss.png) in out_dir; returns the report's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    plot_levels(results, out_dir / "throughput.png")
    if results.get("soak"):
        plot_rss(results, out_dir / "rss.png")
    path = out_dir / "report.md"
    path.write_text(render_markdown(results))
    return path


def load_run(path: str | Path) -> dict:
    """A bench-serve results.json, or the --out directory holding one."""
    path = Path(path)
    path = path / "results.json" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"no bench-serve results at {path}")
    results = json.loads(path.read_text())
    if not isinstance(results, dict) or results.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a bench-serve results.json (format {FORMAT})")
    return results


def compare_markdown(runs: Sequence[dict]) -> str:
    """Per C: each run's aggregate tok/s and TTFT p95, then each later run over the first ('-' where missing).

    Example: runs 'draftwise' then 'llama-server' -> columns C | draftwise tok/s | draftwise TTFT p95 s |
    llama-server tok/s | llama-server TTFT p95 s | llama-server/draftwise tok/s | llama-server/draftwise TTFT p95.
    """
    labels = [run_label(run) for run in runs]
    by_c = [{s["concurrency"]: s for s in run["levels"]} for run in runs]
    headers = ["C"] + [f"{label} {col}" for label in labels for col in ("tok/s", "TTFT p95 s")]
    headers += [f"{label}/{labels[0]} {col}" for label in labels[1:] for col in ("tok/s", "TTFT p95")]

    def ratio(c: int, run: dict, key: str) -> str:
        first, other = by_c[0].get(c, {}).get(key), run.get(c, {}).get(key)
        return f"{other / first:.2f}x" if first and other is not None else "-"

    rows = []
    for c in sorted(set().union(*by_c)):
        row = [c]
        for run in by_c:
            row += [_num(run.get(c, {}).get("tokens_per_second"), ".1f"), _num(run.get(c, {}).get("ttft_p95_s"), ".3f")]
        for run in by_c[1:]:
            row += [ratio(c, run, "tokens_per_second"), ratio(c, run, "ttft_p95_s")]
        rows.append(row)
    return markdown_table(headers, rows) + "\n"
