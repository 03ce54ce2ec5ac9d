"""report.html from a small fake result set: a well-formed page with the report's table rows, the
plots inline as data: URIs, nothing loaded from elsewhere, the recorded answers' tokens as spans
with their sources (baseline's beside auto's), every text escaped; old results without spans
render without that section; `bench --report-only` writes it too.
"""

import base64
import json
from html.parser import HTMLParser

from click.testing import CliRunner

from draftwise.bench.record.results import compact_spans
from draftwise.bench.reports.report import category_rows, time_account_rows, write_report
from draftwise.bench.reports.report_html import render_html
from draftwise.cli import main
from draftwise.types import TokenSpan
from tests.unit.test_bench_report import fake_results, record

VOID = {"meta", "img", "br", "hr", "input", "link"}
CODE_SPANS = [
    ["def sub(a, b):", "target", 1, 0, 0],
    ["\n    return a - b", "ngram", 2, 4, 3],
    ["\n", "target", 2, 4, 3],
]


class Page(HTMLParser):
    """The page's tags (checked to nest and close), table rows as cell texts, the spans inside
    answers, and every src / href."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.tags: list[str] = []
        self.rows: list[tuple[str, ...]] = []
        self.answers: list[dict] = []  # {"method", "spans": [(attrs, text)]}
        self.urls: list[str] = []
        self._cell: list[str] | None = None
        self._row: list[str] | None = None
        self._span: dict | None = None
        self.feed(text)
        self.close()
        assert not self.open, f"unclosed tags: {self.open}"

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        self.urls += [v for k, v in attrs.items() if k in ("src", "href")]
        if tag not in VOID:
            self.open.append(tag)
        if tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "div" and "data-method" in attrs:
            self.answers.append({"method": attrs["data-method"], "spans": []})
        elif tag == "span" and "data-source" in attrs:
            self._span = {**attrs, "text": ""}

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()
        if tag in ("td", "th") and self._row is not None:
            self._row.append("".join(self._cell or []))
            self._cell = None
        elif tag == "tr":
            self.rows.append(tuple(self._row or []))
            self._row = None
        elif tag == "span" and self._span is not None:
            self.answers[-1]["spans"].append(self._span)
            self._span = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._span is not None:
            self._span["text"] += data


def timed(r: dict) -> dict:
    """A record with a time account (80% forward, 10% draft, 9% loop)."""
    if r.get("error"):
        return r
    ms = r["decode_ms"]
    return {**r, "time_ms": {"forward": 0.8 * ms, "draft": 0.1 * ms, "loop": 0.09 * ms, "other": 0.01 * ms}}


def traced_results() -> dict:
    """fake_results with a time account and spans on question 1's (code) and 3's (chat) answers."""
    results = fake_results()
    results["records"] = [timed(r) for r in results["records"]]
    for r in results["records"]:
        if r["question_id"] == 1:
            r["spans"] = [[t, "target", i + 1, 0, 0] for i, (t, *_) in enumerate(CODE_SPANS)]
            if r["method"] == "ngram":
                r["spans"] = CODE_SPANS
                r["tokens_by_source"] = {"target": 2, "ngram": 3}
        elif r["question_id"] == 3 and r["method"] == "baseline":
            r["spans"] = [["Once upon a time", "target", 1, 0, 0]]
    return results


def test_the_page_is_well_formed_with_the_report_tables_and_the_plots_inline(tmp_path):
    results = traced_results()
    write_report(results, tmp_path)
    page = Page((tmp_path / "report.html").read_text(encoding="utf-8"))
    for row in category_rows(results["records"]):  # the same rows as report.md's table
        assert tuple(str(c) for c in row) in page.rows, row
    account = time_account_rows(results["records"])
    assert account and all(tuple(str(c) for c in row) in page.rows for row in account)
    assert ("target", "toy") in page.rows and ("draft model", "toy-draft") in page.rows
    images = [u for u in page.urls if u.startswith("data:")]
    assert len(images) == len(list(tmp_path.glob("*.png"))) == 4
    for uri in images:
        assert uri.startswith("data:image/png;base64,")
        assert base64.b64decode(uri.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_page_loads_nothing_from_elsewhere_and_runs_no_script(tmp_path):
    write_report(traced_results(), tmp_path)
    page = Page((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert page.urls and not [u for u in page.urls if u.startswith(("http:", "https:", "//"))]
    assert {u for u in page.urls if not u.startswith("data:")} == {"report.md", "results.json"}
    assert "script" not in page.tags and "link" not in page.tags and "iframe" not in page.tags


def test_recorded_answers_show_each_span_with_its_source_and_step():
    page = Page(render_html(traced_results()))
    by_method = {a["method"]: a for a in page.answers}
    assert [a["method"] for a in page.answers] == ["baseline", "ngram k=4", "draft k=4", "baseline"]
    ngram = by_method["ngram k=4"]["spans"]
    assert [(s["text"], s["data-source"]) for s in ngram] == [(t, src) for t, src, *_ in CODE_SPANS]
    assert ngram[1]["title"] == "ngram · step 2: 4 drafted, 3 accepted"
    assert {s["data-source"] for s in by_method["baseline"]["spans"]} == {"target"}
    assert "".join(s["text"] for s in ngram) == "def sub(a, b):\n    return a - b\n"
    text = render_html(traced_results())
    assert "target: the target&#39;s own token" in text and "ngram: accepted n-gram draft" in text
    assert "ngram 3, target 2" in text  # the answer's tokens by source


def test_the_auto_answer_is_shown_beside_baselines():
    results = traced_results()
    auto = {**record(1, "code", "auto", 40.0, 2.0, drafted=40, accepted=36), "spans": CODE_SPANS}
    results["records"].append({**auto, "policy_name": "auto"})
    page = Page(render_html(results))
    assert [a["method"] for a in page.answers[:2]] == ["baseline", "auto"]
    text = render_html(results)
    shown, more = text.split("the other methods", 1)
    assert 'data-method="auto"' in shown and 'data-method="ngram k=4"' in more.split("<h3>")[0]


def test_every_text_from_the_run_is_escaped():
    results = traced_results()
    results["meta"]["target"] = "<b>toy</b>"
    for r in results["records"]:
        if r.get("spans"):
            r["spans"] = [['<script>alert("x")</script> & "q"', "target", 1, 0, 0]]
    text = render_html(results)
    page = Page(text)
    assert "script" not in page.tags and "b" not in page.tags
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &#34;q&#34;" in text
    assert page.answers[0]["spans"][0]["text"] == '<script>alert("x")</script> & "q"'
    assert ("target", "<b>toy</b>") in page.rows


def test_old_results_without_spans_render_without_answers(tmp_path):
    results = fake_results()
    page = Page(render_html(results))
    assert page.answers == [] and "recorded no token sources" in render_html(results)
    assert render_html({"records": []}).startswith("<!DOCTYPE html>")


def test_cli_report_only_writes_report_html_and_prints_its_path(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(traced_results()))
    out = CliRunner().invoke(main, ["bench", "--report-only", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert f"html: {tmp_path / 'report.html'}" in out.output
    assert 'data-source="ngram"' in (tmp_path / "report.html").read_text(encoding="utf-8")


def test_spans_are_stored_compactly_one_per_source_and_step():
    spans = [
        TokenSpan("a", "ngram", 1, 2, 2),
        TokenSpan("b", "ngram", 1, 2, 2),
        TokenSpan("c", "target", 1, 2, 2),
        TokenSpan("d", "target", 2, 0, 0),
    ]
    assert compact_spans(spans) == [["ab", "ngram", 1, 2, 2], ["c", "target", 1, 2, 2], ["d", "target", 2, 0, 0]]
