"""Replay the edits whose target entropies target_confidence.py kept, with the lookups'
estimates split by the target's recent confidence: a proposal planned at answer position q
whose rows before q (the last `window`) reached `threshold` nats of entropy is rated by an
estimate of its own (key suffix ":unsure"), learned from such proposals alone. The variants:

- "base": the policy as it is.
- "unsure16_01", "unsure16_05": the 16 rows before q, at 0.01 or 0.05 nats.
- "unsure1_01": the row before q alone (the bonus token's), at 0.01 nats.
- "unsure<window>_<nats>": any other, e.g. unsure4_0.003.

    python docs/bench/policy-unseen/lookahead/replay_confidence.py base,unsure16_01,unsure16_05,unsure1_01 \\
        corpus/dev.jsonl entropies-dev24.npz docs/bench/policy-unseen/zen4/curve.json

The variants wrap the policy's methods in this script; the policy has no such options.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

from draftwise import models
from draftwise.backends.base import text_marks
from draftwise.bench.offline import replay
from draftwise.bench.suites import prompts
from draftwise.loading import LoadOptions, load_backend
from draftwise.policy import auto
from draftwise.policy.estimates import CopyEstimate

spec = importlib.util.spec_from_file_location("variants", Path(__file__).parents[1] / "zen4" / "replay_variants.py")
variants = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variants)

Policy = auto.AutoPolicy
ORIGINAL = {name: getattr(Policy, name) for name in ("menu", "_after_break", "_copy")}
ORIGINAL_ONE = replay._replay_one
VARIANTS = {"base": None, "unsure16_01": (16, 0.01), "unsure16_05": (16, 0.05), "unsure1_01": (1, 0.01)}
NOW: dict = {"entropy": None, "prompt": 0, "rule": None, "by_answer": {}}


def replay_one(policy, drafters, speculation, prompt_ids, answer_ids, *args, **kwargs):
    NOW["prompt"] = len(prompt_ids)
    NOW["entropy"] = NOW["by_answer"][tuple(answer_ids)]
    return ORIGINAL_ONE(policy, drafters, speculation, prompt_ids, answer_ids, *args, **kwargs)


def menu(self, state):
    window, threshold = NOW["rule"]
    pos = len(state.context) - NOW["prompt"]
    rows = NOW["entropy"][max(0, pos - window) : pos]
    self._unsure = bool(len(rows)) and float(rows.max()) >= threshold
    return ORIGINAL["menu"](self, state)


def after_break(self, key, draft, context_len) -> str:
    out = ORIGINAL["_after_break"](self, key, draft, context_len)
    return f"{out}:unsure" if self._unsure and out else ("unsure" if self._unsure else out)


def copy(self, key: str) -> CopyEstimate:
    est = self._copies.get(key)
    if est is None:
        est = self._copies[key] = CopyEstimate(auto.RESUME_PRIORS if ":resume" in key else None)
    return est


def rule_of(name: str) -> tuple[int, float]:
    """ "unsure<window>_<nats>": e.g. unsure4_0.003 -> (4, 0.003)."""
    window, threshold = name.removeprefix("unsure").split("_", 1)
    return int(window), float(threshold)


def main(names: list[str], split: str, kept: str, curve_file: str) -> None:
    entropy = np.load(kept)
    ids = {int(k) for k in entropy.files}
    pool = [p for p in prompts.load_prompts(split) if p.question_id in ids]
    answers = replay.reference_answers(pool)
    curve = replay.calibrated_curve(json.loads(Path(curve_file).read_text()))
    backend = load_backend(models.DEFAULT_TARGET, LoadOptions(n_ctx=256))
    tokenizer = backend.tokenizer
    marks = text_marks(tokenizer, backend.vocab_size)
    NOW["by_answer"] = {
        tuple(tokenizer.encode(answers[(p.question_id, 0)], add_special=False)): entropy[str(p.question_id)]
        for p in pool
    }
    replay._replay_one = replay_one
    try:
        for name in names:
            rule = VARIANTS[name] if name in VARIANTS else rule_of(name)
            patched = {"menu": menu, "_after_break": after_break, "_copy": copy} if rule else {}
            for attr, method in ORIGINAL.items():
                setattr(Policy, attr, patched.get(attr, method))
            NOW["rule"] = rule
            runs = variants.replay_lookups(name, pool, answers, tokenizer, marks, curve)
            summary = replay.summarize(runs)["all"][name]
            speed, best = summary["speedup"], summary["oracle_speedup"]
            print(f"{name:12} {len(runs)} edits: policy {speed:.3f}x  optimum {best:.3f}x  ({speed / best:.1%})")
    finally:
        for attr, method in ORIGINAL.items():
            setattr(Policy, attr, method)
        replay._replay_one = ORIGINAL_ONE
        backend.close()


if __name__ == "__main__":
    main(sys.argv[1].split(","), *sys.argv[2:5])
