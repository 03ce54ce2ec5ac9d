"""The bench report's sections after the per-setting tables, one function each (records, meta ->
markdown lines, none when the run holds nothing for it), and the rows they tabulate: structured
output, tool calls, fill in the middle, the context sweep, the time account, greedy differences,
memory and errors.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from draftwise.bench.reports.grouping import (
    aggregate,
    format_aggregate,
    geomean,
    markdown_table,
    variant_label,
    variant_order,
)
from draftwise.bench.reports.long_context import long_context_section
from draftwise.bench.suites import tool_calls


def structured_rows(records: Sequence[dict]) -> list[tuple]:
    """Per temperature x variant, over the records of prompts with a JSON schema."""
    rows = []
    schema_records = [r for r in records if "json_valid" in r and not r.get("error")]
    for temperature in sorted({float(r["temperature"]) for r in schema_records}):
        group = [r for r in schema_records if float(r["temperature"]) == temperature]
        for variant in variant_order(group):
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
                    format_aggregate(a)[1],
                    format_aggregate(a)[2],
                    "-" if vs_free is None else f"{vs_free:.2f}x",
                    f"{mask_ms / generated:.3f}" if generated else "-",
                    f"{forced / generated:.0%}" if generated else "-",
                    format_aggregate(a)[5],
                    format_aggregate(a)[6],
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
        for variant in variant_order(group):
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
                    format_aggregate(aggregate(rs))[2],
                    f"{sum(same)}/{len(same)}" if same else "-",
                )
            )
    return rows


ACCOUNT_PARTS = ("forward", "draft", "masks", "force", "verify", "commit", "loop", "other")
ACCOUNT_HEADERS = ("T", "method", *ACCOUNT_PARTS, "accounted", "ms/step")
ACCOUNT_NOTE = (
    "Per method, the share of the measured decode time in each part of the step (all prompts pooled): "
    "forward (the target's forward passes), draft (planning and drafting, lookups included), masks "
    "(grammar masks), force (forced tokens), verify (verification and sampling), commit (cache "
    "truncation, grammar advance, stats), loop (the loop around the step: stop strings, detokenising), "
    "other (the rest of the decode time, between steps). `accounted` is the share the measured parts (all "
    "but other) add up to; ms/step is the decode time per step."
)


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
        for variant in variant_order(group):
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


def error_rows(records: Sequence[dict]) -> list[tuple]:
    failed: dict[str, list[str]] = defaultdict(list)
    for r in records:
        if r.get("error"):
            failed[variant_label(r)].append(r["error"])
    return [(v, len(msgs), msgs[0].replace("|", "/")[:200]) for v, msgs in failed.items()]


# ---------------------------------------------------------------------------- sections
def structured_section(records: Sequence[dict], meta: dict) -> list[str]:
    """Prompts with a JSON schema: validity, mask cost, speed against the unconstrained run."""
    out: list[str] = []
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
    return out


def tool_calls_section(records: Sequence[dict], meta: dict) -> list[str]:
    """Prompts with tools: calls that parse and validate, and the speed under their constraint."""
    out: list[str] = []
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
    return out


def fim_section(records: Sequence[dict], meta: dict) -> list[str]:
    """Fill-in-the-middle prompts: exact matches, edit similarity, prompt and generation time."""
    out: list[str] = []
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
    return out


def context_sweep_section(records: Sequence[dict], meta: dict) -> list[str]:
    """Prompts padded to several context lengths: all categories pooled, per length."""
    out: list[str] = []
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
            for variant in variant_order(records):
                for ctx in contexts:
                    group = [
                        r
                        for r in records
                        if r.get("context_tokens") == ctx
                        and variant_label(r) == variant
                        and float(r["temperature"]) == temperature
                    ]
                    if group:
                        a = format_aggregate(aggregate(group))
                        rows.append((f"{temperature:g}", variant, ctx, a[1], a[2], a[4], a[5]))
        out += [
            markdown_table(("T", "method", "context tokens", "tok/s", "speedup", "acceptance", "tokens/step"), rows),
            "",
        ]
    return out


def time_account_section(records: Sequence[dict], meta: dict) -> list[str]:
    """Where each method's decode time goes, part by part of the step."""
    out: list[str] = []
    account = time_account_rows(records)
    if account:
        out += [
            "## Where the decode time goes",
            "",
            ACCOUNT_NOTE,
            "",
            markdown_table(ACCOUNT_HEADERS, account),
            "",
        ]
    return out


def differences_section(records: Sequence[dict], meta: dict) -> list[str]:
    """Greedy answers that leave plain decoding's: where, and the logprob gap there."""
    out: list[str] = []
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
    return out


MEMORY_BUDGET = 0.40  # the project brief: speculation adds at most 40% to plain decoding's memory
MB = 2**20
MEMORY_HEADERS = (
    "method",
    "n",
    "RSS MB",
    "peak RSS MB",
    "target KV used MB",
    "target KV reserved MB",
    "draft KV used MB",
    "drafter indexes MB",
    "speculation adds",
    "by RSS",
)
MEMORY_NOTE = (
    "Per method, the largest figure over its runs, each read at the run's end: RSS (resident memory then) and "
    "peak RSS (the process's peak so far: methods alternate prompt by prompt, so it is the run's), the KV "
    "caches' bytes from the models' shapes (used: positions held; reserved: what the cache allocates, "
    "llama.cpp its whole context up front) and the drafters' own state (n-gram and suffix indexes, the "
    "datastore's mapped files; drafter_bytes in the records). speculation adds = (draft weights + draft KV "
    "reserved + drafter indexes) / (target weights + target KV reserved), weights as their libraries hold "
    "them (*_weights_mb above); by RSS = (the draft model's measured overhead + drafter indexes) / the "
    "target's (draft_overhead_mb, target_overhead_mb above: runtime buffers, llama.cpp's repacked weights "
    f"included). The brief allows +{MEMORY_BUDGET:.0%}."
)


def memory_rows(records: Sequence[dict], meta: dict) -> list[tuple]:
    """Per variant, over its records with memory figures (kv_target_bytes, kv_draft_bytes,
    drafter_bytes): the columns of MEMORY_HEADERS.

    Example: target weights 1060 MB + KV reserved 112 MB, draft weights 463 MB + KV 48 MB, no
    index -> speculation adds +43.6% (over +40%)."""
    memory = meta.get("memory") or {}
    measured = [r for r in records if r.get("kv_target_bytes") and not r.get("error")]
    rows = []
    for variant in variant_order(measured):
        rs = [r for r in measured if variant_label(r) == variant]
        target = [r["kv_target_bytes"] for r in rs]
        draft = [r["kv_draft_bytes"] for r in rs if r.get("kv_draft_bytes")]
        indexes = max(sum((r.get("drafter_bytes") or {}).values()) for r in rs)
        draft_weights = sum(memory.get(f"{d}_weights_mb") or 0.0 for d in rs[0].get("drafters", ())) * MB
        target_reserved = max(kv["allocated"] for kv in target)
        base = (memory.get("target_weights_mb") or 0.0) * MB + target_reserved
        extra = (draft_weights if draft else 0.0) + max((kv["allocated"] for kv in draft), default=0) + indexes
        rss_extra = max((r.get("memory_overhead_mb") or 0.0 for r in rs), default=0.0) * MB + indexes
        rss_base = (memory.get("target_overhead_mb") or 0.0) * MB

        rows.append(
            (
                variant,
                len(rs),
                _largest([r.get("rss_mb") for r in rs], MB, ".0f"),
                _largest([r.get("peak_rss_mb") for r in rs], MB, ".0f"),
                _largest([kv["used"] for kv in target]),
                _largest([target_reserved]),
                _largest([kv["used"] for kv in draft]),
                _largest([indexes]),
                _share(extra / base) if base else "-",
                _share(rss_extra / rss_base) if rss_base else "-",
            )
        )
    return rows


def _largest(values: Sequence[float | None], unit: float = 1, fmt: str = ".2f") -> str:
    """The largest of values in MB (unit: the bytes one of them counts, 1 for bytes); '-' for none."""
    known = [v for v in values if v is not None]
    return format(max(known) * unit / MB, fmt) if known else "-"


def _share(value: float) -> str:
    return f"+{value:.1%}" + (f" (over +{MEMORY_BUDGET:.0%})" if value > MEMORY_BUDGET else "")


def memory_section(records: Sequence[dict], meta: dict) -> list[str]:
    """The memory probes of the load (bench.sweep.runner.load_bench_engine) and the models' weights, then
    per method what its runs held (memory_rows)."""
    out: list[str] = []
    memory = meta.get("memory") or {}
    rows = memory_rows(records, meta)
    if memory or rows:
        out += ["## Memory", ""]
    if memory:
        out += [markdown_table(("measure", "MB"), [(k, v) for k, v in memory.items()]), ""]
    if rows:
        out += [MEMORY_NOTE, "", markdown_table(MEMORY_HEADERS, rows), ""]
    return out


def errors_section(records: Sequence[dict], meta: dict) -> list[str]:
    """Methods whose runs failed, with the first error."""
    out: list[str] = []
    errors = error_rows(records)
    if errors:
        out += ["## Errors", "", markdown_table(("method", "records", "first error"), errors), ""]
    return out


SECTIONS = (
    structured_section,
    tool_calls_section,
    fim_section,
    context_sweep_section,
    long_context_section,
    time_account_section,
    differences_section,
    memory_section,
    errors_section,
)
