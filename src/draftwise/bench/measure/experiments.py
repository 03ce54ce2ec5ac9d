"""The registry of measurements (EXPERIMENTS: name -> Experiment) and the one way their results are
kept: `record(name, options, result, out)` writes `out/results.json` with the format tag, the
experiment's name and options, the host (bench.record.timing.host_info) and the time, atomically
(bench.record.results.save_results), and returns the dict it wrote.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

from draftwise.bench.record.results import now, save_results
from draftwise.bench.record.timing import host_info

FORMAT = "draftwise-measure/1"


@dataclass(frozen=True)
class Experiment:
    """One measurement: its command name, what it measures (one line), the module that runs it and
    the pages whose figures it reproduces."""

    name: str
    summary: str
    module: str
    cited_by: tuple[str, ...]


EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment(
            "fim-layouts",
            "prefix-suffix-middle against suffix-prefix-middle prompts: which order a model completes better",
            "draftwise.bench.measure.fim_layouts",
            ("docs/code-completion.md",),
        ),
        Experiment(
            "logprob-drift",
            "logprobs under speculation against plain decoding on llama.cpp: how far verification batches move them",
            "draftwise.bench.measure.logprob_drift",
            ("docs/exactness.md", "docs/bench/README.md"),
        ),
        Experiment(
            "openmp-teams",
            "what a second OpenMP team costs llama.cpp's one-row forward, each arrangement in a fresh process",
            "draftwise.bench.measure.openmp_teams",
            ("docs/bench/serve-peers/README.md",),
        ),
        Experiment(
            "step-overhead",
            "the engine's Python time per step over the exact toy backend, plain and with n-gram drafts",
            "draftwise.bench.measure.step_overhead",
            ("docs/benchmark.md", "docs/design.md", "docs/bench/step-overhead/report.md"),
        ),
        Experiment(
            "unload",
            "resident memory after models are loaded, asked for a few tokens and unloaded, cycle after cycle",
            "draftwise.bench.measure.unload",
            ("docs/bench/unload-cycles/README.md",),
        ),
    )
}


def record(name: str, options: dict[str, Any], result: Any, out: Path) -> dict:
    """Write `out/results.json` for one run of experiment `name` and return what was written.
    `result` is a frozen dataclass (or a dict) of the figures."""
    if name not in EXPERIMENTS:
        raise KeyError(f"unknown experiment {name!r}; known: {', '.join(sorted(EXPERIMENTS))}")
    figures = asdict(result) if is_dataclass(result) and not isinstance(result, type) else dict(result)
    written = {
        "format": FORMAT,
        "experiment": name,
        "options": {k: v for k, v in options.items() if v is not None},
        "meta": {"host": host_info(), "finished": now()},
        "result": figures,
    }
    out.mkdir(parents=True, exist_ok=True)
    save_results(out / "results.json", written)
    return written
