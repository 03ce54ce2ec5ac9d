"""draftwise bench: evidence for when speculation pays, per task type.

Suites of Spec-Bench-style prompts (prompts.py), the runner that decodes each prompt
with every method back to back (runner.py), and the report (report.py).
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
