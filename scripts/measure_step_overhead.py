"""The engine's Python time per step, with no model time worth speaking of: the exact toy backend
(vocabulary 64), 200 greedy tokens from a 390-token prompt, plain and with n-gram drafts (k = 4),
the best of N runs. Compare two commits by running it with PYTHONPATH pointing at each one's src/
(e.g. a `git worktree add /tmp/old COMMIT`), alternately, on a quiet machine.

Usage: python scripts/measure_step_overhead.py [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import time

import draftwise.engine
from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.drafters import NgramDrafter
from draftwise.engine import Engine
from draftwise.types import SamplingParams, SpeculationConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    model = ToyModel(vocab_size=64, order=2, seed=3, sharpness=3.0)
    out: dict = {"engine": draftwise.engine.__file__}
    settings = {
        "plain": SpeculationConfig(enabled=False),
        "ngram": SpeculationConfig(policy="fixed", max_draft_tokens=4),
    }
    for name, speculation in settings.items():
        best, steps = float("inf"), 0
        for _ in range(runs):
            engine = Engine(ToyBackend(model, n_ctx=2048), [NgramDrafter(1, 3)])
            t0 = time.perf_counter()
            result = engine.generate(
                prompt_ids=list(range(1, 40)) * 10,
                sampling=SamplingParams(max_tokens=200, ignore_eos=True),
                speculation=speculation,
            )
            best, steps = min(best, time.perf_counter() - t0), result.stats.num_steps
        out[name] = {"ms": round(1000 * best, 2), "steps": steps, "us_per_step": round(1e6 * best / steps, 1)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
