"""The bench report: results.json -> report.md (per-category x method tables) and PNG plots.

Aggregates: decode tokens/s is a mean over records, speedup a geometric mean of
per-prompt ratios, acceptance and tokens/step are pooled (sums over records), so
long outputs weigh more. Plots use matplotlib's object API (no pyplot global state).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from draftwise.bench import tool_calls
from draftwise.bench.prompts import CATEGORIES

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


# ---------------------------------------------------------------------------- grouping
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


def _variant_order(records: Sequence[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for r in records:
        seen.setdefault(variant_label(r), None)
    return sorted(seen, key=lambda v: (v != "baseline", list(seen).index(v)))


def _category_order(records: Sequence[dict]) -> list[str]:
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
    variants = _variant_order(records)
    rows = []
    for category in [*_category_order(records), "all"]:
        for variant in variants:
            group = (
                [r for r in records if variant_label(r) == variant]
                if category == "all"
                else by_key.get((category, variant))
            )
            if group:
                rows.append((category, variant, *_format(aggregate(group))))
    return rows


def _format(a: dict) -> tuple:
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
    for variant in _variant_order(records):
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


# ---------------------------------------------------------------------------- markdown
def markdown_table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(results: dict, plots: Sequence[str] = ()) -> str:
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
    ceiling = always_right_ceiling(meta.get("calibration", {}).get("target"))
    if ceiling:
        out += [
            f"Always-right ceiling from this run's calibration: **{ceiling[0]:.2f}x** at k = {ceiling[1]} (a drafter "
            "whose every token is accepted, at no drafting cost: best over k of (k+1)·cost(1)/cost(k+1)).",
            "",
        ]
    other = [r["other_cpu_share"] for r in records if r.get("other_cpu_share") is not None]
    if other:
        busy = [x for x in other if x > COMPETING_SHARE]
        out += [
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
    settings = by_setting(records)
    for setting, group in settings.items():
        out += [f"## {setting_label(setting)}", ""]
        headline = []
        for variant in _variant_order(group):
            if variant == "baseline":
                continue
            g = geomean(r.get("speedup") for r in group if variant_label(r) == variant and not r.get("error"))
            headline.append(f"{variant} **{g:.2f}x**" if g else f"{variant} -")
        if headline:
            out += ["Overall geometric-mean speedup vs baseline: " + ", ".join(headline) + ".", ""]
        out += [markdown_table(TABLE_HEADERS, category_rows(group)), ""]
        stab = stability(group)
        if stab:
            out += [
                (
                    f"Speed over the output (windows of {group[0].get('window_tokens', 32)} tokens; late/early = "
                    "mean tok/s of the second half of the windows / the first half, geometric mean over prompts):"
                ),
                "",
            ]
            out.append(
                markdown_table(
                    ("method", "prompts", "windows", "first window tok/s", "last window tok/s", "late/early"),
                    [
                        (
                            v,
                            s["n"],
                            s["windows"],
                            f"{s['first']:.1f}",
                            f"{s['last']:.1f}",
                            f"{s['late_over_early']:.2f}",
                        )
                        for v, s in stab.items()
                    ],
                )
            )
            out.append("")
    structured = structured_rows(records)
    if structured:
        out += [
            "## Structured output",
            "",
            "Prompts with a JSON schema (every method constrained by it; `@unconstrained`: without it). JSON / "
            "schema valid = the answer parses / also validates against the schema (jsonschema). mask ms/token = "
            "time computing grammar masks per generated token; forced = share of tokens the grammar forced "
            "(committed with no target decision). speedup = vs the baseline of the same constraint; "
            "vs unconstrained = tok/s over plain unconstrained decoding of the same prompt.",
            "",
            markdown_table(
                (
                    "T",
                    "method",
                    "n",
                    "JSON valid",
                    "schema valid",
                    "tok/s",
                    "speedup",
                    "vs unconstrained",
                    "mask ms/token",
                    "forced",
                    "tokens/step",
                    "identical",
                ),
                structured,
            ),
            "",
        ]
    tools = tool_calls.tool_rows(records)
    if tools:
        out += [
            "## Tool calls",
            "",
            "Prompts with tools (every method decodes under the calls' constraint of the prompt's tool_choice, as "
            "the server does). parse = the answer is text or calls that parse; names exist / args valid = every "
            "call names a tool / its arguments validate against its parameters (jsonschema); decision = the "
            "functions called are the expected ones (none when none is expected); speedup = vs plain decoding "
            "under the same constraint.",
            "",
            markdown_table(tool_calls.TOOL_HEADERS, tools),
            "",
        ]
    completion = fim_rows(records)
    if completion:
        out += [
            "## Code completion (fill in the middle)",
            "",
            "Prompts with a suffix, built as /infill builds them. exact = the middle equals the removed text "
            "(trailing whitespace ignored); edit sim. = 1 - Levenshtein distance / longer length, mean; prompt ms "
            "cold = the first read of the prompt, warm = with it cached (as measured); generation ms = decode time; "
            "speedup = generation tok/s over plain decoding.",
            "",
            markdown_table(
                (
                    "T",
                    "method",
                    "n",
                    "exact",
                    "edit sim.",
                    "prompt ms cold",
                    "prompt ms warm",
                    "generation ms",
                    "speedup",
                    "identical",
                ),
                completion,
            ),
            "",
        ]
    contexts = sorted({r.get("context_tokens") for r in records if r.get("context_tokens")})
    if len(contexts) > 1:
        out += [
            "## Context sweep",
            "",
            "Prompts padded with unrelated text to about N tokens; all categories pooled.",
            "",
        ]
        rows = []
        for temperature in sorted({float(r["temperature"]) for r in records}):
            for variant in _variant_order(records):
                for ctx in contexts:
                    group = [
                        r
                        for r in records
                        if r.get("context_tokens") == ctx
                        and variant_label(r) == variant
                        and float(r["temperature"]) == temperature
                    ]
                    if group:
                        a = _format(aggregate(group))
                        rows.append((f"{temperature:g}", variant, ctx, a[1], a[2], a[4], a[5]))
        out += [
            markdown_table(("T", "method", "context tokens", "tok/s", "speedup", "acceptance", "tokens/step"), rows),
            "",
        ]
    account = time_account_rows(records)
    if account:
        out += [
            "## Where the decode time goes",
            "",
            "Per method, the share of the measured decode time in each part of the step (all prompts pooled): "
            "forward (the target's forward passes), draft (planning and drafting, lookups included), masks "
            "(grammar masks), force (forced tokens), verify (verification and sampling), commit (cache "
            "truncation, grammar advance, stats), loop (the loop around the step: stop strings, detokenising), "
            "other (the rest of the decode time, between steps). `accounted` is the share the measured parts (all "
            "but other) add up to; ms/step is the decode time per step.",
            "",
            markdown_table(("T", "method", *ACCOUNT_PARTS, "accounted", "ms/step"), account),
            "",
        ]
    differences = difference_rows(records)
    if differences:
        out += [
            "## Greedy answers that differ from plain decoding",
            "",
            "Where each differing answer leaves plain decoding's: the first differing token (position in the "
            "answer), plain decoding's token and the method's, and gap = logprob(plain's token) - logprob(the "
            "method's) in plain decoding's own row at that position (plain decoding run again with logprobs), in "
            "nats (> top-20: the method's token is not among the row's 20 most likely). Where plain decoding "
            "run again takes another path before that position (its cache filled otherwise, so llama.cpp's "
            "rows round differently), the row is read after plain's own tokens given as the prompt. A gap of a "
            "few hundredths is a near-tie that batched verification's numerics can flip on llama.cpp; a large "
            "gap would be a bug.",
            "",
            markdown_table(("question", "turn", "method", "position", "plain", "method's", "gap (nats)"), differences),
            "",
        ]
    memory = meta.get("memory") or {}
    if memory:
        out += ["## Memory", "", markdown_table(("measure", "MB"), [(k, v) for k, v in memory.items()]), ""]
    errors = _errors(records)
    if errors:
        out += ["## Errors", "", markdown_table(("method", "records", "first error"), errors), ""]
    if plots:
        out += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    return "\n".join(out)


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


def structured_rows(records: Sequence[dict]) -> list[tuple]:
    """Per temperature x variant, over the records of prompts with a JSON schema."""
    rows = []
    schema_records = [r for r in records if "json_valid" in r and not r.get("error")]
    for temperature in sorted({float(r["temperature"]) for r in schema_records}):
        group = [r for r in schema_records if float(r["temperature"]) == temperature]
        for variant in _variant_order(group):
            rs = [r for r in group if variant_label(r) == variant]
            a = aggregate(rs)
            generated = sum(r["num_generated"] for r in rs)
            mask_ms = sum(r.get("mask_ms", 0.0) for r in rs)
            forced = sum(r.get("num_forced_tokens", 0) for r in rs)
            vs_free = geomean(r.get("speedup_vs_unconstrained") for r in rs)
            rows.append(
                (
                    f"{temperature:g}",
                    variant,
                    len(rs),
                    f"{sum(r['json_valid'] for r in rs) / len(rs):.0%}",
                    f"{sum(r['schema_valid'] for r in rs) / len(rs):.0%}",
                    _format(a)[1],
                    _format(a)[2],
                    "-" if vs_free is None else f"{vs_free:.2f}x",
                    f"{mask_ms / generated:.3f}" if generated else "-",
                    f"{forced / generated:.0%}" if generated else "-",
                    _format(a)[5],
                    _format(a)[6],
                )
            )
    return rows


def fim_rows(records: Sequence[dict]) -> list[tuple]:
    """Per temperature x variant over fill-in-the-middle records: n, exact match, mean edit
    similarity, mean prompt ms cold (the warm-up's first read) and warm (cached, as measured),
    mean generation ms, geometric-mean speedup, answers identical to plain decoding's."""
    rows = []
    scored = [r for r in records if "exact_match" in r and not r.get("error")]
    for temperature in sorted({float(r["temperature"]) for r in scored}):
        group = [r for r in scored if float(r["temperature"]) == temperature]
        for variant in _variant_order(group):
            rs = [r for r in group if variant_label(r) == variant]
            cold = [r["cold_prefill_ms"] for r in rs if r.get("cold_prefill_ms") is not None]
            same = [r["identical_to_baseline"] for r in rs if r.get("identical_to_baseline") is not None]
            rows.append(
                (
                    f"{temperature:g}",
                    variant,
                    len(rs),
                    f"{sum(r['exact_match'] for r in rs) / len(rs):.0%}",
                    f"{sum(r['edit_similarity'] for r in rs) / len(rs):.3f}",
                    f"{sum(cold) / len(cold):.0f}" if cold else "-",
                    f"{sum(r['prefill_ms'] for r in rs) / len(rs):.0f}",
                    f"{sum(r['decode_ms'] for r in rs) / len(rs):.0f}",
                    _format(aggregate(rs))[2],
                    f"{sum(same)}/{len(same)}" if same else "-",
                )
            )
    return rows


ACCOUNT_PARTS = ("forward", "draft", "masks", "force", "verify", "commit", "loop", "other")


def difference_rows(records: Sequence[dict]) -> list[tuple]:
    """(question, turn, method, position, plain token, method's token, gap) for each record whose
    greedy answer differs from the baseline's (the runner's `divergence`)."""
    rows = []
    for r in records:
        d = r.get("divergence")
        if not d:
            continue
        if "error" in d:
            rows.append((r["question_id"], r["turn"], variant_label(r), "-", "-", "-", d["error"]))
            continue
        gap = d.get("gap_nats")
        shown = d.get("note") or ("> top-20" if gap is None else f"{gap:.4f}")
        if d.get("forced") and not d.get("note"):
            shown += " (row read after plain's tokens)"
        elif d.get("reproduced") is False and not d.get("note"):
            shown = "not measured (plain decoding run again took another path)"
        rows.append(
            (
                r["question_id"],
                r["turn"],
                variant_label(r),
                d["position"],
                repr(d.get("plain_token")).replace("|", "\\|"),
                repr(d.get("other_token")).replace("|", "\\|"),
                shown,
            )
        )
    return rows


def time_account_rows(records: Sequence[dict]) -> list[tuple]:
    """Per temperature x variant: each part's share of the decode time (plan counts as draft).

    Example: forward 80 ms, draft 10 ms, loop 9 ms of a 100 ms decode -> 80%, 10%, ..., other 1%,
    accounted 99%."""
    rows = []
    timed = [r for r in records if r.get("time_ms") and r.get("decode_ms") and not r.get("error")]
    for temperature in sorted({float(r["temperature"]) for r in timed}):
        group = [r for r in timed if float(r["temperature"]) == temperature]
        for variant in _variant_order(group):
            rs = [r for r in group if variant_label(r) == variant]
            decode = sum(r["decode_ms"] for r in rs)
            parts = defaultdict(float)
            for r in rs:
                for part, ms in r["time_ms"].items():
                    parts["draft" if part == "plan" else part] += ms
            steps = sum(r["num_steps"] for r in rs)
            rows.append(
                (
                    f"{temperature:g}",
                    variant,
                    *(f"{parts[p] / decode:.1%}" for p in ACCOUNT_PARTS),
                    f"{sum(ms for p, ms in parts.items() if p != 'other') / decode:.1%}",
                    f"{decode / steps:.1f}" if steps else "-",
                )
            )
    return rows


def _errors(records: Sequence[dict]) -> list[tuple]:
    failed: dict[str, list[str]] = defaultdict(list)
    for r in records:
        if r.get("error"):
            failed[variant_label(r)].append(r["error"])
    return [(v, len(msgs), msgs[0].replace("|", "/")[:200]) for v, msgs in failed.items()]


# ---------------------------------------------------------------------------- plots
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
        variants = [v for v in _variant_order(group) if v != "baseline"]
        categories = _category_order(group) + ["all"]
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
        variants = _variant_order(group)
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
    for variant in _variant_order(records):
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


def write_report(results: dict, out_dir: str | Path) -> Path:
    """Write report.md and the PNG plots next to it; returns the report's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = results.get("records", [])
    plots = [
        plot_speedup_by_category(records, out_dir / "speedup_by_category.png"),
        plot_tokens_per_second_over_output(records, out_dir / "tokens_per_second_over_output.png"),
        plot_acceptance_by_position(records, out_dir / "acceptance_by_position.png"),
        plot_cost_curve(records, results.get("meta", {}), out_dir / "cost_curve.png"),
        plot_context_sweep(records, out_dir / "context_sweep.png"),
    ]
    path = out_dir / "report.md"
    path.write_text(render_markdown(results, [str(p) for p in plots if p is not None]))
    return path
