"""The bench report's header: what ran on what, how it was measured, the calibration (and the
always-right ceiling it gives) and how busy the host was, as markdown lines (report.md's top;
report.html shows the same paragraphs).
"""

from __future__ import annotations

from collections.abc import Sequence

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


def header_lines(results: dict) -> list[str]:
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
