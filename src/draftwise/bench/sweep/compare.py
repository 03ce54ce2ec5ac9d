"""Each bench record against its baseline: speedup (raw and drift-corrected), identical output,
and, for a greedy answer that differs, where it leaves plain decoding's and by what logprob gap.
"""

from __future__ import annotations

from dataclasses import replace

from draftwise.types import SamplingParams, SpeculationConfig

MIN_PLAIN_STEPS = 8


def compare_with_baseline(records: list[dict], greedy: bool) -> None:
    """speedup = decode tok/s over the same prompt and turn's baseline; identical: greedy only.

    speedup_drift_corrected measures each run's time in units of its own plain (k = 0) step
    time, so a machine that slows down or speeds up between two runs (shared, noisy) cancels;
    None when either run has fewer than MIN_PLAIN_STEPS plain steps to time that unit.
    """
    base = {
        (r["turn"], r.get("constrained", False)): r
        for r in records
        if r["policy_name"] == "none" and not r.get("error")
    }
    for r in records:
        if r.get("error"):
            continue
        b = base.get((r["turn"], r.get("constrained", False)))
        if b is None:
            r["speedup"], r["identical_to_baseline"] = None, None
            continue
        b_tps = b["decode_tokens_per_second"]
        r["speedup"] = r["decode_tokens_per_second"] / b_tps if b_tps > 0 else None
        r_rate, b_rate = tokens_per_plain_step(r), tokens_per_plain_step(b)
        r["speedup_drift_corrected"] = r_rate / b_rate if r_rate and b_rate else None
        r["identical_to_baseline"] = (r["_token_ids"] == b["_token_ids"]) if greedy else None
        free = base.get((r["turn"], False))  # a constrained run against the plain unconstrained one
        if r.get("constrained") and free is not None and free["decode_tokens_per_second"] > 0:
            r["speedup_vs_unconstrained"] = r["decode_tokens_per_second"] / free["decode_tokens_per_second"]


def tokens_per_plain_step(r: dict) -> float | None:
    """Generated tokens per (mean plain step time) of decoding: a machine-speed-free rate."""
    plain = r.get("num_plain_steps", 0)
    if plain < MIN_PLAIN_STEPS or not r.get("decode_ms") or not r.get("plain_step_ms"):
        return None
    return r["num_generated"] * (r["plain_step_ms"] / plain) / r["decode_ms"]


def divergence(
    engine, prompt_ids: list[int], plain: list[int], other: list[int], sampling: SamplingParams | None = None
) -> dict:
    """Where answer `other` leaves `plain` (greedy plain decoding's, under `sampling`'s
    constraint) and the logprob gap there: {"position", "plain_token", "other_token" (texts),
    "gap_nats": logprob(plain's token) - logprob(other's) in plain decoding's own row at that
    position (None: other's token is not among the row's 20 most likely), "reproduced"}. The row
    is plain decoding's own: plain decoding runs again, a token per forward from the cached
    prompt as it first ran, with logprobs (reproduced: it gave the same tokens up to there; when
    it did not, "forced": the row is read after plain's first i tokens given as prompt).
    Example: a gap of 0.02 is a near-tie."""
    i = next((j for j, (a, b) in enumerate(zip(plain, other)) if a != b), min(len(plain), len(other)))
    out: dict = {"position": i, "plain_token": None, "other_token": None, "gap_nats": None}
    if i >= len(plain) or i >= len(other):  # one answer is the other's prefix: it stopped earlier
        out["note"] = "one answer ends where the other goes on"
        return out
    base = sampling or SamplingParams()
    probe = engine.generate(
        prompt_ids=prompt_ids,
        sampling=replace(base, temperature=0.0, max_tokens=i + 1, logprobs=20, ignore_eos=True, stop=()),
        speculation=SpeculationConfig(enabled=False),
    )
    decode = engine.tokenizer.decode
    out.update(plain_token=decode([plain[i]]), other_token=decode([other[i]]))
    out["reproduced"] = list(probe.token_ids[: i + 1]) == list(plain[: i + 1])
    at = probe.logprobs[i] if probe.logprobs and len(probe.logprobs) > i else None
    if not out["reproduced"]:
        # Plain decoding run again took another path before i (its cache was filled otherwise:
        # llama.cpp's rows then round differently), so its row i has another context. The row
        # after plain's own first i tokens, read as part of the prompt, has the right one.
        forced = engine.generate(
            prompt_ids=list(prompt_ids) + list(plain[:i]),
            sampling=replace(base, temperature=0.0, max_tokens=1, logprobs=20, ignore_eos=True, stop=()),
            speculation=SpeculationConfig(enabled=False),
        )
        at, out["forced"] = (forced.logprobs[0] if forced.logprobs else None), True
    if at is not None:
        row = dict(at.top)
        if plain[i] in row and other[i] in row:
            out["gap_nats"] = round(row[plain[i]] - row[other[i]], 4)
    return out
