"""The engine's Python time per step, with no model time worth speaking of: the exact toy backend
(vocabulary 64), `max_tokens` greedy tokens from a 390-token prompt, plain and with n-gram drafts
(k = 4), the best of `runs` runs. Compare two commits by running `draftwise measure step-overhead`
with PYTHONPATH pointing at each one's src/ (e.g. a `git worktree add /tmp/old COMMIT`),
alternately, on a quiet machine (docs/bench/step-overhead).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import draftwise.engine
from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.drafters import NgramDrafter
from draftwise.engine import Engine
from draftwise.types import SamplingParams, SpeculationConfig

SETTINGS = {
    "plain": SpeculationConfig(enabled=False),
    "ngram": SpeculationConfig(policy="fixed", max_draft_tokens=4),
}


@dataclass(frozen=True)
class StepTime:
    """The best run of one setting: its wall time, the engine's steps and the time per step."""

    ms: float
    steps: int
    us_per_step: float


@dataclass(frozen=True)
class StepOverhead:
    engine: str  # the engine module timed: which src/ the run imported
    runs: int
    max_tokens: int
    plain: StepTime
    ngram: StepTime


def measure(runs: int = 15, max_tokens: int = 200, on_run: Callable[[str], None] | None = None) -> StepOverhead:
    """Best of `runs` for each setting; `on_run(setting)` after every run (a progress bar's tick)."""
    if runs < 1 or max_tokens < 1:
        raise ValueError(f"runs and max_tokens must be at least 1, got {runs} and {max_tokens}")
    model = ToyModel(vocab_size=64, order=2, seed=3, sharpness=3.0)
    timed = {}
    for name, speculation in SETTINGS.items():
        best, steps = float("inf"), 0
        for _ in range(runs):
            engine = Engine(ToyBackend(model, n_ctx=2048), [NgramDrafter(1, 3)])
            t0 = time.perf_counter()
            result = engine.generate(
                prompt_ids=list(range(1, 40)) * 10,
                sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                speculation=speculation,
            )
            best, steps = min(best, time.perf_counter() - t0), result.stats.num_steps
            if on_run is not None:
                on_run(name)
        timed[name] = StepTime(ms=round(1000 * best, 2), steps=steps, us_per_step=round(1e6 * best / steps, 1))
    return StepOverhead(
        engine=draftwise.engine.__file__, runs=runs, max_tokens=max_tokens, plain=timed["plain"], ngram=timed["ngram"]
    )
