"""draftwise bench: evidence for when speculation pays, per task type, and every figure the docs
publish, one command away.

One sub-package per room, each saying in its __init__ what it holds: record (host, clocks,
progress, results file: what every measurement shares), suites (the prompt files and what reads
them), sweep (`draftwise bench`: prompts x methods through the Engine), reports (report.md, the
page, plots), offline (`draftwise replay`: a run read back without the model), serving
(`draftwise bench-serve`: load, keystrokes, server processes), side_by_side (servers side by
side), corpus (`draftwise corpus`), measure (`draftwise measure NAME`: the experiments behind
published figures). The names below are the bench's API for a script.
"""

from draftwise.bench.reports.report import write_report
from draftwise.bench.suites.prompts import Prompt, PromptFileError, load_prompts, load_suite
from draftwise.bench.sweep.methods import MethodSpec, parse_methods
from draftwise.bench.sweep.runner import BenchConfig, BenchRunner, run_bench

__all__ = [
    "BenchConfig",
    "BenchRunner",
    "MethodSpec",
    "Prompt",
    "PromptFileError",
    "load_prompts",
    "load_suite",
    "parse_methods",
    "run_bench",
    "write_report",
]
