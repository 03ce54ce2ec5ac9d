"""Add `cold_reused_tokens` to this run's first-turn records, which the bench began to record
after the run (commit after 7f54f93): the prompt tokens each prompt's cold read took from the
cache of the prompt before it, the longest common prefix of their chat-templated ids (the engine
reuses exactly that prefix; the previous prompt's answer follows its prompt, so it adds nothing).
Then rewrites report.md and report.html from results.json.

    python docs/bench/long-context/annotate_cold_reuse.py
"""

from __future__ import annotations

import json
from pathlib import Path

from draftwise.backends.base import common_prefix_length
from draftwise.bench.record.results import save_results
from draftwise.bench.reports import report as bench_report
from draftwise.bench.suites.prompts import load_suite
from draftwise.engine import Engine
from draftwise.loading import LoadOptions, load_backend

HERE = Path(__file__).parent


def main() -> None:
    results = json.loads((HERE / "results.json").read_text())
    prompts = {p.question_id: p for p in load_suite("long")}
    backend = load_backend(results["meta"]["target"], LoadOptions(n_ctx=256))
    try:
        engine = Engine(backend, [])
        order = list(dict.fromkeys(r["question_id"] for r in results["records"]))
        ids = {q: engine.encode_prompt(messages=[{"role": "user", "content": prompts[q].turns[0]}]) for q in order}
    finally:
        backend.close()
    reused = {q: common_prefix_length(ids[q], ids[p]) if p else 0 for p, q in zip([None, *order], order)}
    for r in results["records"]:
        if r["turn"] == 0:
            r["cold_reused_tokens"] = reused[r["question_id"]]
    save_results(HERE / "results.json", results)
    bench_report.write_report(results, HERE)
    print({q: (len(ids[q]), reused[q]) for q in order})


if __name__ == "__main__":
    main()
