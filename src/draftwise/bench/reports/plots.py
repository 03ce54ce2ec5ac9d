"""The bench report's PNG plots (matplotlib's object API, no pyplot global state): speedup by
category, tokens/s over the output, acceptance by draft position, the cost curves, the context sweep.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from draftwise.bench.reports.grouping import (
    aggregate,
    by_setting,
    category_order,
    geomean,
    setting_label,
    variant_label,
    variant_order,
)


def _figure(num_rows: int = 1, width: float = 9.0, height: float = 4.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height * num_rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(num_rows, 1, i + 1) for i in range(num_rows)]
    return fig, axes


def _color(i: int, n: int):
    """Distinct colours for up to 20 series (matplotlib's default cycle repeats after 10)."""
    if n <= 10:
        return f"C{i}"
    from matplotlib import colormaps

    return colormaps["tab20"](i % 20)


def plot_speedup_by_category(records: Sequence[dict], path: Path) -> Path | None:
    settings = {s: g for s, g in by_setting(records).items() if any(r.get("speedup") for r in g)}
    if not settings:
        return None
    fig, axes = _figure(len(settings))
    for ax, (setting, group) in zip(axes, settings.items()):
        variants = [v for v in variant_order(group) if v != "baseline"]
        categories = category_order(group) + ["all"]
        width = 0.8 / max(1, len(variants))
        for i, variant in enumerate(variants):
            values = []
            for c in categories:
                rs = [
                    r
                    for r in group
                    if variant_label(r) == variant and (c == "all" or r["category"] == c) and not r.get("error")
                ]
                values.append(geomean(r.get("speedup") for r in rs) or 0.0)
            ax.bar(
                [j + i * width - 0.4 + width / 2 for j in range(len(categories))],
                values,
                width,
                label=variant,
                color=_color(i, len(variants)),
            )
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(categories)), categories, rotation=20)
        ax.set_ylabel("speedup vs baseline (geo. mean)")
        ax.set_title(f"Speedup by category — {setting_label(setting)}")
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)
    return path


def plot_tokens_per_second_over_output(records: Sequence[dict], path: Path) -> Path | None:
    settings = {s: g for s, g in by_setting(records).items() if any(r.get("tokens_per_second_windows") for r in g)}
    if not settings:
        return None
    fig, axes = _figure(len(settings))
    for ax, (setting, group) in zip(axes, settings.items()):
        variants = variant_order(group)
        for vi, variant in enumerate(variants):
            sums: dict[int, list[float]] = defaultdict(list)
            window = 32
            for r in group:
                if variant_label(r) != variant or r.get("error"):
                    continue
                window = r.get("window_tokens", window)
                for i, v in enumerate(r.get("tokens_per_second_windows") or []):
                    if v:
                        sums[i].append(v)
            if sums:
                xs = sorted(sums)
                ax.plot(
                    [(i + 1) * window for i in xs],
                    [sum(sums[i]) / len(sums[i]) for i in xs],
                    marker="o",
                    markersize=3,
                    label=variant,
                    color=_color(vi, len(variants)),
                )
        ax.set_xlabel("output position (tokens, end of window)")
        ax.set_ylabel("tokens/s (mean over prompts)")
        ax.set_title(f"Tokens/s over the output — {setting_label(setting)}")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)
    return path


def plot_acceptance_by_position(records: Sequence[dict], path: Path) -> Path | None:
    pooled: dict[str, tuple[list[int], list[int]]] = {}
    for r in records:
        if r.get("error") or not r.get("position_drafted"):
            continue
        label = variant_label(r) + ("" if r["temperature"] == 0 else f" T={r['temperature']:g}")
        drafted, accepted = pooled.setdefault(label, ([], []))
        for i, (d, a) in enumerate(zip(r["position_drafted"], r["position_accepted"])):
            if i >= len(drafted):
                drafted.append(0)
                accepted.append(0)
            drafted[i] += d
            accepted[i] += a
    if not pooled:
        return None
    fig, (ax,) = _figure(1)
    for i, (label, (drafted, accepted)) in enumerate(pooled.items()):
        xs = [j + 1 for j, d in enumerate(drafted) if d]
        ax.plot(
            xs,
            [accepted[j - 1] / drafted[j - 1] for j in xs],
            marker="o",
            markersize=3,
            label=label,
            color=_color(i, len(pooled)),
        )
    ax.set_xlabel("draft position")
    ax.set_ylabel("fraction of drafts accepted at this position")
    ax.set_ylim(0, 1.02)
    ax.set_title("Acceptance by draft position (pooled over prompts)")
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)
    return path


def calibrated_curves(records: Sequence[dict], meta: dict) -> dict[str, list[tuple[int, float]]]:
    """Cost curves (n new tokens -> ms) found in meta['calibration'] or in the policy snapshots.

    Accepted shapes: {"target": {"1": 30.6, "2": 61.4}, ...} or {"target_cost_ms": [30.6, 61.4, ...]}
    (list index i is n = i + 1). Whatever the auto policy reports under a key containing 'cost'.
    """
    found: dict[str, list[tuple[int, float]]] = {}

    def visit(obj, name: str) -> None:
        if isinstance(obj, dict):
            if obj and all(_is_int(k) and isinstance(v, (int, float)) for k, v in obj.items()):
                if "cost" in name or "calibrat" in name:
                    found.setdefault(name, sorted((int(k), float(v)) for k, v in obj.items()))
                return
            for k, v in obj.items():
                visit(v, f"{name}.{k}" if name else str(k))
        elif isinstance(obj, list) and obj and all(isinstance(v, (int, float)) for v in obj) and "cost" in name:
            found.setdefault(name, [(i + 1, float(v)) for i, v in enumerate(obj)])

    if meta.get("calibration"):
        visit(meta["calibration"], "calibrated")
    for r in records:
        if isinstance(r.get("policy"), dict):
            visit(r["policy"], "policy")
    return found


def _is_int(text) -> bool:
    try:
        int(text)
        return True
    except (TypeError, ValueError):
        return False


def plot_cost_curve(records: Sequence[dict], meta: dict, path: Path) -> Path | None:
    """Measured: ms per target forward vs tokens verified per forward, one point per record.

    Calibrated curves (if the auto policy or a calibration run reported them) are drawn as lines.
    """
    points: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for r in records:
        if r.get("error") or not r.get("num_steps"):
            continue
        xs, ys = points[r["method"]]
        xs.append(1 + r["num_drafted"] / r["num_steps"])
        ys.append((r["verify_ms"] if r["num_drafted"] else r["decode_ms"]) / r["num_steps"])
    curves = calibrated_curves(records, meta)
    if not points and not curves:
        return None
    fig, (ax,) = _figure(1)
    for method, (xs, ys) in points.items():
        ax.scatter(xs, ys, s=12, label=f"measured: {method}")
    for name, curve in curves.items():
        label = name.replace("calibrated.", "calibrated ").replace("policy.", "auto policy's estimate: ")
        ax.plot([n for n, _ in curve], [ms for _, ms in curve], marker="x", label=label)
    ax.set_xlabel("tokens per target forward (1 + drafted tokens per step)")
    ax.set_ylabel("ms per forward")
    ax.set_title("Cost of one verification forward")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)
    return path


def plot_context_sweep(records: Sequence[dict], path: Path) -> Path | None:
    contexts = sorted({r.get("context_tokens") for r in records if r.get("context_tokens")})
    if len(contexts) < 2:
        return None
    fig, axes = _figure(2)
    for variant in variant_order(records):
        speed, acc = [], []
        for ctx in contexts:
            a = aggregate([r for r in records if variant_label(r) == variant and r.get("context_tokens") == ctx])
            speed.append(a["speedup"])
            acc.append(a["acceptance_rate"])
        if variant != "baseline" and any(speed):
            axes[0].plot(contexts, [s or float("nan") for s in speed], marker="o", label=variant)
        if any(a is not None for a in acc):
            axes[1].plot(contexts, [a if a is not None else float("nan") for a in acc], marker="o", label=variant)
    for ax, ylabel in zip(axes, ("speedup vs baseline", "acceptance rate")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize="small")
    axes[0].axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    axes[0].set_title("Speedup and acceptance vs context length")
    fig.savefig(path, dpi=110)
    return path
