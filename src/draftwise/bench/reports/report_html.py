"""The bench report as one self-contained page, report.html beside report.md: the header facts,
the per-setting tables, the plots inline (data: URIs), the time account, and per category one
answer with its tokens coloured by source (the runner's `spans`), baseline's beside auto's.

The rows come from the functions report.md is made with (bench.reports.report_header, bench.reports.grouping,
bench.reports.report_sections); the page is a jinja2 template with autoescaping, so every text from the
run is escaped. It loads nothing from elsewhere and runs no script.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import jinja2
from markupsafe import Markup, escape

from draftwise.bench.reports import long_context
from draftwise.bench.reports.grouping import (
    STABILITY_HEADERS,
    TABLE_HEADERS,
    by_setting,
    category_order,
    category_rows,
    headline_speedups,
    setting_label,
    stability_note,
    stability_rows,
    variant_label,
    variant_order,
)
from draftwise.bench.reports.report_header import header_lines
from draftwise.bench.reports.report_sections import ACCOUNT_HEADERS, ACCOUNT_NOTE, time_account_rows

TEMPLATE = "report.html.j2"
# Where a token came from -> (colour, what it means); a source not named here gets a spare colour.
SOURCES = {
    "target": ("#ffffff", "the target's own token (plain step, correction, bonus)"),
    "ngram": ("#ffd8a8", "accepted n-gram draft"),
    "suffix": ("#d0bfff", "accepted suffix-tree draft"),
    "draft": ("#a5d8ff", "accepted draft-model draft"),
    "prediction": ("#b2f2bb", "accepted from the prediction"),
    "grammar": ("#dee2e6", "forced by the grammar"),
    "calls": ("#ffc9c9", "accepted tool-call skeleton draft"),
    "datastore": ("#fcc2d7", "accepted datastore draft"),
}
SPARE_COLOURS = ("#ffec99", "#99e9f2", "#eebefa", "#c0eb75", "#ffa8a8")
PLOT_CAPTIONS = {
    "speedup_by_category": "Speedup by category",
    "tokens_per_second_over_output": "Tokens/s over the output",
    "acceptance_by_position": "Acceptance by draft position",
    "cost_curve": "Cost of one verification forward",
    "context_sweep": "Speedup and acceptance vs context length",
    "long_context": "Speed, speedup and acceptance over the context read",
    "long_outputs": "Long answers: speed and acceptance over the output",
}


def render_html(results: dict, plots: Sequence[Path] = ()) -> str:
    """The page for a results dict; plots: PNG files to inline."""
    records = results.get("records", [])
    answers = answer_groups(records)
    sources = legend(answers)
    css = {s["name"]: s["css"] for s in sources}
    for group in answers:
        for a in [*group["shown"], *group["more"]]:
            for span in a["spans"]:
                span["css"] = css[span["source"]]
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    page = resources.files("draftwise.bench.reports").joinpath(TEMPLATE).read_text(encoding="utf-8")
    template = env.from_string(page)
    return template.render(
        target=results.get("meta", {}).get("target", "?"),
        intro=intro(results),
        facts=facts(results),
        settings=[setting_tables(setting, group) for setting, group in by_setting(records).items()],
        plots=[plot_image(Path(p)) for p in plots],
        long_headers=long_context.CONTEXT_HEADERS,
        long_rows=long_context.context_rows(records) if long_context.applies(records) else [],
        long_note=inline(long_context.CONTEXT_NOTE),
        long_output_headers=long_context.OUTPUT_HEADERS,
        long_output_rows=long_context.output_rows(records, results.get("meta", {})),
        account_headers=ACCOUNT_HEADERS,
        account_rows=time_account_rows(records),
        account_note=inline(ACCOUNT_NOTE),
        answers=answers,
        sources=sources,
    )


def inline(text: str) -> Markup:
    """report.md's inline markup as HTML, the text escaped: **bold** and `code`.

    Example: "a **1.5x** <b>" -> "a <strong>1.5x</strong> &lt;b&gt;".
    """
    html = str(escape(text))
    html = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html)
    return Markup(re.sub(r"`(.+?)`", r"<code>\1</code>", html))


def intro(results: dict) -> list[Markup]:
    """report.md's header paragraphs (what ran on what, how measured, calibration, a busy host)."""
    return [inline(line) for line in header_lines(results) if line and not line.startswith("#")]


def facts(results: dict) -> list[tuple[str, str]]:
    """(name, value) rows of what ran: the models, the host and the settings; unknown ones left out."""
    config, meta = results.get("config", {}), results.get("meta", {})
    host = meta.get("host") or {}
    rows = [
        ("target", meta.get("target")),
        ("draft model", meta.get("draft_model")),
        ("drafters", meta.get("drafters")),
        ("prompts", meta.get("prompts")),
        ("host", " · ".join(str(host[k]) for k in ("cpu", "isa", "platform", "machine") if host.get(k))),
        ("CPUs", host.get("cpus")),
        ("backend", meta.get("backend")),
        ("threads", meta.get("threads")),
        ("context size", meta.get("n_ctx")),
        ("methods", config.get("methods")),
        ("temperatures", config.get("temperatures")),
        ("k", config.get("ks")),
        ("max tokens", config.get("max_tokens")),
        ("repeats", config.get("repeats")),
        ("seed", config.get("seed")),
        ("top-k, top-p, min-p", _join([config.get("top_k"), config.get("top_p"), config.get("min_p")])),
        ("ignore EOS", config.get("ignore_eos")),
        ("started", meta.get("started_at")),
        ("finished", meta.get("finished_at") or ("(run incomplete)" if not results.get("complete") else None)),
    ]
    return [(name, _join(value)) for name, value in rows if value not in (None, "", [])]


def _join(value) -> str | None:
    if isinstance(value, (list, tuple)):
        shown = [str(v) for v in value if v is not None]
        return ", ".join(shown) if shown else None
    return None if value is None else str(value)


def setting_tables(setting: tuple, group: Sequence[dict]) -> dict:
    """One temperature x context: the headline speedups, the category table, speed over the output."""
    headline = [
        Markup("{} <strong>{:.2f}x</strong>").format(variant, g) if g else Markup("{} -").format(variant)
        for variant, g in headline_speedups(group)
    ]
    return {
        "label": setting_label(setting),
        "headline": Markup(", ").join(headline),
        "headers": TABLE_HEADERS,
        "rows": category_rows(group),
        "stability_note": stability_note(group),
        "stability_headers": STABILITY_HEADERS,
        "stability_rows": stability_rows(group),
    }


def plot_image(path: Path) -> dict:
    """A PNG as a data: URI with its caption."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return {
        "caption": PLOT_CAPTIONS.get(path.stem, path.stem.replace("_", " ")),
        "uri": f"data:image/png;base64,{data}",
    }


# ---------------------------------------------------------------------------- token sources
def answer_groups(records: Sequence[dict]) -> list[dict]:
    """Per recorded prompt (one per category): a title, the answers shown side by side (baseline's
    and auto's, else the first other method's) and the other methods' answers."""
    traced = [r for r in records if r.get("spans") and not r.get("error")]
    groups: dict[tuple, list[dict]] = {}
    for category in category_order(traced):
        for r in traced:
            if r["category"] == category:
                key = (category, r["question_id"], r["turn"], float(r["temperature"]), r.get("context_tokens"))
                groups.setdefault(key, []).append(r)
    return [_group(key, rs) for key, rs in groups.items()]


def _group(key: tuple, records: list[dict]) -> dict:
    category, question_id, turn, temperature, ctx = key
    by_variant = {variant_label(r): r for r in records}
    order = variant_order(records)
    shown = [v for v in ("baseline" if "baseline" in by_variant else None, _partner(by_variant, order)) if v]
    title = f"{category} · question {question_id}" + (f" · turn {turn + 1}" if turn else "")
    return {
        "title": f"{title} · {setting_label((temperature, ctx))}",
        "shown": [answer(by_variant[v]) for v in shown],
        "more": [answer(by_variant[v]) for v in order if v not in shown],
    }


def _partner(by_variant: dict[str, dict], order: list[str]) -> str | None:
    """The answer shown beside baseline's: the auto method's, else the first auto policy's, else
    the first other method's."""
    others = [v for v in order if v != "baseline"]
    for wanted in (lambda r: r["method"] == "auto", lambda r: r.get("policy_name") == "auto"):
        found = [v for v in others if wanted(by_variant[v])]
        if found:
            return found[0]
    return others[0] if others else None


def answer(record: dict) -> dict:
    """One answer: its method, its figures, and its spans with their hover titles."""
    spans = [
        {
            "text": text,
            "source": source,
            "title": f"{source} · step {step}: {drafted} drafted, {accepted} accepted",
        }
        for text, source, step, drafted, accepted in record["spans"]
    ]
    return {"label": variant_label(record), "stats": answer_stats(record), "spans": spans}


def answer_stats(record: dict) -> str:
    """Example: '40 tokens in 10 steps · acceptance 75% · 1.50x baseline · ngram 30, target 10'."""
    parts = [f"{record.get('num_generated', '?')} tokens in {record.get('num_steps', '?')} steps"]
    if record.get("num_drafted"):
        parts.append(f"acceptance {record['num_accepted'] / record['num_drafted']:.0%}")
    if record.get("speedup") and record.get("method") != "baseline":
        parts.append(f"{record['speedup']:.2f}x baseline")
    counts = record.get("tokens_by_source") or {}
    if counts:
        parts.append(", ".join(f"{s} {n}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1])))
    return " · ".join(parts)


def legend(groups: Sequence[dict]) -> list[dict]:
    """The sources in the shown answers, each with a CSS class, a colour and what it means."""
    seen = dict.fromkeys(span["source"] for g in groups for a in [*g["shown"], *g["more"]] for span in a["spans"])
    known = [s for s in SOURCES if s in seen] + [s for s in seen if s not in SOURCES]
    out = []
    for i, name in enumerate(known):
        colour, meaning = SOURCES.get(name, (SPARE_COLOURS[i % len(SPARE_COLOURS)], "accepted draft"))
        out.append({"name": name, "css": f"s{i}", "colour": colour, "meaning": meaning})
    return out
