"""Long context and long outputs in a bench run (the `long` suite, docs/long-context.md): speed,
acceptance, prefill and time to first token by the context a turn read, and speed over long
answers in blocks of 512 tokens.

A record's context is its `num_prompt_tokens` (the conversation so far for a later turn), not a
padded length (the context sweep's `context_tokens`): the long suite's prompts are long as
shipped, and a 40-turn conversation passes through every bucket. Buckets are powers of two
(`context_bucket`), named by their lower bound. Prefill is the prompt's cold read (the warm-up's,
`cold_prefill_ms`: the timed runs reuse its cache), so it is shown for first turns only; TTFT
cold = that prefill + the timed run's first step (its `ttft_ms` less its own, reused, prefill).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from draftwise.bench.offline.account import bucket
from draftwise.bench.record.timing import acceptance_windows, block_rates, step_windows
from draftwise.bench.reports.grouping import aggregate, markdown_table, variant_label, variant_order

LONG_CONTEXT = 4096  # records reading this many prompt tokens or more make the section appear
LONG_OUTPUT = 1024  # answers of this many tokens or more are shown in 512-token blocks
BLOCK = 512
BUCKETS = (0, 1024, 2048, 4096, 8192, 16384, 24576)  # lower bounds


def context_bucket(tokens: int) -> int:
    """The largest bound <= tokens. Example: 17000 -> 16384."""
    return bucket(tokens, BUCKETS)


def bucket_label(bound: int) -> str:
    """8192 -> '8k+'; 0 -> '<1k'."""
    return "<1k" if bound == 0 else f"{bound // 1024}k+"


def applies(records: Sequence[dict]) -> bool:
    ok = [r for r in records if not r.get("error")]
    return any(r.get("num_prompt_tokens", 0) >= LONG_CONTEXT or r.get("num_generated", 0) >= LONG_OUTPUT for r in ok)


def _cold_ttft_ms(r: dict) -> float | None:
    if r.get("turn", 0) != 0 or r.get("cold_prefill_ms") is None or r.get("ttft_ms") is None:
        return None
    return r["cold_prefill_ms"] + max(0.0, r["ttft_ms"] - r.get("prefill_ms", 0.0))


def context_rows(records: Sequence[dict]) -> list[tuple]:
    """Per context bucket x method: records, mean prompt tokens, the longest cold prefill (s) and
    the rate prompts were read at (tokens read, those not reused from the prompt before, over
    the time: first turns), the longest cold TTFT (s), decode tok/s, speedup (geo. mean),
    acceptance."""
    groups: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for r in records:
        if not r.get("error") and r.get("num_prompt_tokens"):
            groups[context_bucket(r["num_prompt_tokens"]), variant_label(r)].append(r)
    order = variant_order(records)
    rows = []
    for (bound, variant), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], order.index(kv[0][1]))):
        a = aggregate(rs)
        firsts = [r for r in rs if r.get("turn", 0) == 0 and r.get("cold_prefill_ms")]
        known = [r for r in firsts if r.get("cold_reused_tokens") is not None]
        read = sum(r["num_prompt_tokens"] - r["cold_reused_tokens"] for r in known)
        seconds = sum(r["cold_prefill_ms"] for r in known) / 1000
        ttfts = [t for t in (_cold_ttft_ms(r) for r in rs) if t is not None]
        rows.append(
            (
                bucket_label(bound),
                variant,
                len(rs),
                f"{sum(r['num_prompt_tokens'] for r in rs) / len(rs):,.0f}",
                f"{max(r['cold_prefill_ms'] for r in firsts) / 1000:.1f}" if firsts else "-",
                f"{read / seconds:.0f}" if known and seconds > 0 else "-",
                f"{max(ttfts) / 1000:.1f}" if ttfts else "-",
                "-" if a["tokens_per_second"] is None else f"{a['tokens_per_second']:.1f}",
                "-" if a["speedup"] is None else f"{a['speedup']:.2f}x",
                "-" if a["acceptance_rate"] is None else f"{a['acceptance_rate']:.0%}",
            )
        )
    return rows


CONTEXT_HEADERS = (
    "context",
    "method",
    "records",
    "prompt tokens",
    "cold prefill s (longest)",
    "prefill tok/s",
    "TTFT s (cold, longest)",
    "decode tok/s",
    "speedup",
    "acceptance",
)


CONTEXT_NOTE = (
    "By the context each turn read (its prompt tokens; a conversation's later turns read the turns "
    "before). Cold prefill is a prompt's first read (first turns only; the timed runs reuse its cache), "
    "the longest in the bucket; prefill tok/s counts the tokens read, not those reused from the prompt "
    "before where they share a context (results without cold_reused_tokens: -); TTFT (cold) adds the "
    "first step to that read."
)


def output_blocks(record: dict) -> list[float | None]:
    """A record's tokens/s in blocks of 512 output tokens (full blocks only)."""
    return block_rates(record.get("tokens_per_second_windows") or [], record.get("window_tokens", 32), BLOCK)


def target_curve(meta: dict):
    """The run's calibrated target curve with its growth over context (None: not calibrated)."""
    from draftwise.calibrate import CostCurve

    return CostCurve.from_meta(meta)


def curve_expected(record: dict, curve) -> float | None:
    """What the context's growth alone does to a method's speed over an answer, by the calibrated
    curve: the first block's steps (their rows as they were) priced at their own context over the
    same steps priced as far into the answer as the last block (the tok/s ratio last/first to
    expect if drafting went on alike). Plain decoding's steps are one row each; a method's long
    drafts are many-row forwards, whose cost grows faster with the context. None without a curve
    or the record's steps."""
    steps, tokens = record.get("step_times") or [], record.get("step_tokens") or []
    blocks = record.get("num_generated", 0) // BLOCK
    if curve is None or not curve.grows or blocks < 2 or len(steps) != len(tokens):
        return None
    first = [(rows, ctx) for (rows, ctx, _, _), b in zip(steps, step_windows(tokens, BLOCK)) if b == 0 and rows]
    if not first:
        return None
    shift = BLOCK * (blocks - 1)
    return sum(curve.ms(n, c) for n, c in first) / sum(curve.ms(n, c + shift) for n, c in first)


def block_steps(record: dict, curve) -> list[tuple[float, float | None]]:
    """Per full block of BLOCK output tokens (by where each step starts): the tokens committed per
    step, and the target's measured forward time over the curve's price of the same forwards (below
    1: faster than calibrated; None without a curve). What changes between the first and the last
    block besides the context's growth: how far the method drafted and how much of it held, and
    how fast the forwards ran against their price (the machine, or the curve's growth for forwards
    of that many rows)."""
    steps, tokens = record.get("step_times") or [], record.get("step_tokens") or []
    blocks = record.get("num_generated", 0) // BLOCK
    if len(steps) != len(tokens) or not blocks:
        return []
    sums = [[0, 0, 0.0, 0.0] for _ in range(blocks)]  # steps, tokens, measured ms, priced ms
    for (rows, ctx, forward_ms, _), (committed, _, _), b in zip(steps, tokens, step_windows(tokens, BLOCK)):
        if b >= blocks:
            break
        sums[b][0] += 1
        sums[b][1] += committed
        if rows and curve is not None:
            sums[b][2] += forward_ms
            sums[b][3] += curve.ms(rows, ctx)
    return [(t / n, measured / priced if priced else None) for n, t, measured, priced in sums if n]


def output_rows(records: Sequence[dict], meta: dict | None = None) -> list[tuple]:
    """Per long answer: question, category, method, tokens, first block tok/s, last block, the
    slowest block over the first, what the calibrated curve expects of last/first from the
    context's growth alone (curve_expected), tokens per step and forward time over the curve in
    the first and the last block (block_steps), and the method's speedup."""
    curve = target_curve(meta or {})
    rows = []
    for r in records:
        if r.get("error") or r.get("num_generated", 0) < LONG_OUTPUT:
            continue
        blocks = [b for b in output_blocks(r) if b]
        if len(blocks) < 2:
            continue
        by_step = block_steps(r, curve)
        ends = (by_step[0], by_step[-1]) if len(by_step) >= 2 else ()
        per_step = " / ".join(f"{tps:.1f}" for tps, _ in ends) or "-"
        known = ends and all(m is not None for _, m in ends)
        machine = " / ".join(f"{m:.2f}" for _, m in ends) if known else "-"
        rows.append(
            (
                r["question_id"],
                r["category"],
                variant_label(r),
                r["num_generated"],
                f"{blocks[0]:.1f}",
                f"{blocks[-1]:.1f}",
                f"{blocks[-1] / blocks[0]:.2f}",
                f"{min(blocks) / blocks[0]:.2f}",
                "-" if (e := curve_expected(r, curve)) is None else f"{e:.2f}",
                per_step,
                machine,
                "-" if r.get("speedup") is None else f"{r['speedup']:.2f}x",
            )
        )
    return rows


OUTPUT_HEADERS = (
    "question",
    "category",
    "method",
    "tokens",
    "first 512 tok/s",
    "last 512 tok/s",
    "last/first",
    "slowest/first",
    "last/first by the curve",
    "tokens/step first / last",
    "forward vs curve first / last",
    "speedup",
)


def long_context_section(records: Sequence[dict], meta: dict) -> list[str]:
    if not applies(records):
        return []
    out = [
        "## Long context",
        "",
        CONTEXT_NOTE,
        "",
        markdown_table(CONTEXT_HEADERS, context_rows(records)),
        "",
    ]
    rows = output_rows(records, meta)
    if rows:
        out += [
            "### Long outputs",
            "",
            f"Answers of {LONG_OUTPUT}+ tokens in blocks of {BLOCK} tokens (decode tok/s of each block; "
            "last/first and slowest/first: how speed holds over the answer; by the curve: what the growing "
            "context alone does to it, the first block's steps priced by the run's calibration at their own "
            "context and as far into the answer as the last block). What else moved between the first and "
            "the last block: tokens committed per step (how far the method drafted and how much of it "
            "held), and the forwards' measured time over the curve's price of them (below 1: faster than "
            "the calibration priced them; a change from the first block to the last is the machine's speed, "
            "or the curve's growth with context for forwards of that many rows).",
            "",
            markdown_table(OUTPUT_HEADERS, rows),
            "",
        ]
    return out


def plot_long_context(records: Sequence[dict], path: Path) -> Path | None:
    """Three panels over the context a turn read: decode tok/s per method, speedup per method,
    acceptance per method (one point a record, log-2 x axis)."""
    if not applies(records):
        return None
    from draftwise.bench.reports.plots import _color, _figure

    ok = [r for r in records if not r.get("error") and r.get("num_prompt_tokens")]
    variants = variant_order(ok)
    fig, axes = _figure(3, height=3.4)
    for vi, variant in enumerate(variants):
        rs = [r for r in ok if variant_label(r) == variant]
        color = _color(vi, len(variants))
        xs = [r["num_prompt_tokens"] for r in rs]
        axes[0].scatter(xs, [r["decode_tokens_per_second"] for r in rs], s=12, color=color, label=variant)
        sp = [(r["num_prompt_tokens"], r["speedup"]) for r in rs if r.get("speedup")]
        if sp and variant != "baseline":
            axes[1].scatter(*zip(*sp), s=12, color=color, label=variant)
        acc = [(r["num_prompt_tokens"], r["acceptance_rate"]) for r in rs if r.get("num_drafted")]
        if acc:
            axes[2].scatter(*zip(*acc), s=12, color=color, label=variant)
    for ax, label in zip(axes, ("decode tokens/s", "speedup vs baseline", "acceptance rate")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context read (prompt tokens)")
        ax.set_ylabel(label)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    axes[0].set_title("Speed, speedup and acceptance over the context")
    axes[1].axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    axes[2].set_ylim(0, 1.02)
    fig.savefig(path, dpi=110)
    return path


def plot_long_outputs(records: Sequence[dict], path: Path) -> Path | None:
    """Two panels over the output of the long answers: tok/s per 512-token block, and acceptance
    per 512 tokens (from the steps' accepted drafts), one line per answer and method."""
    long = [r for r in records if not r.get("error") and r.get("num_generated", 0) >= LONG_OUTPUT]
    if not long:
        return None
    from draftwise.bench.reports.plots import _color, _figure

    fig, axes = _figure(2, height=3.6)
    variants = variant_order(long)
    styles = ("-", "--", ":", "-.")
    questions = sorted({r["question_id"] for r in long})
    for r in long:
        color = _color(variants.index(variant_label(r)), len(variants))
        style = styles[questions.index(r["question_id"]) % len(styles)]
        label = f"q{r['question_id']} {variant_label(r)}"
        blocks = output_blocks(r)
        xs = [(i + 1) * BLOCK for i, b in enumerate(blocks) if b]
        if xs:
            axes[0].plot(xs, [b for b in blocks if b], style, marker="o", markersize=3, color=color, label=label)
        acc = _acceptance_blocks(r)
        xa = [(i + 1) * BLOCK for i, a in enumerate(acc) if a is not None]
        if xa:
            ys = [a for a in acc if a is not None]
            axes[1].plot(xa, ys, style, marker="o", markersize=3, color=color, label=label)
    axes[0].set_ylabel(f"decode tok/s per {BLOCK} tokens")
    axes[0].set_title("Long answers: speed and acceptance over the output")
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylabel(f"acceptance per {BLOCK} tokens")
    axes[1].set_ylim(0, 1.02)
    for ax in axes:
        ax.set_xlabel("output position (tokens, end of block)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small", ncol=2)
    fig.savefig(path, dpi=110)
    return path


def _acceptance_blocks(record: dict) -> list[float | None]:
    """Acceptance per 512 output tokens from the record's per-step (committed, drafted, accepted)."""
    return acceptance_windows(record.get("step_tokens") or [], BLOCK)


__all__ = [
    "applies",
    "bucket_label",
    "context_bucket",
    "context_rows",
    "long_context_section",
    "output_rows",
    "plot_long_context",
    "plot_long_outputs",
]
