"""Replay with the lookups' acceptance estimates carried from earlier requests as they are ("base")
or with part of that record shrunk at each request's start (the README's tables). Variants:
"all50" shrinks every bucket's hits and trials to half, "short50" and "short25" only the buckets
of match lengths below 16 (to half, to a quarter). The floor's variants of
[floor-fim](../floor-fim/README.md): "cap3" drafts at most 3 tokens of a match shorter than
8; "split256" keeps the lookups' record twice, for prompts under 256 tokens and for the rest;
"short50p512" is short50 for prompts under 512 tokens only; "own25p512" leaves the record as it is
and prices a prompt under 512 tokens' short matches with the record's earlier part at a quarter
and its own proposals in full. "resume16", "resume32", "resume64": a copy must have held that
many tokens before its break makes a later proposal near it a resume (the policy's
RESUME_MIN_COPY, 48 since [resume-48](../resume-48/README.md)). Lookups free; `ngram` and `suffix`.

A SOURCE is a bench run's folder (its own answers at its own forwards' prices), or
SPLIT.jsonl:RUN (a corpus split's reference answers, edit/copy/fim, priced at RUN's forwards):

    python docs/bench/policy-unseen/request-local/replay_variants.py base,short50 \
        docs/bench/policy-unseen/rewrites/specbench-mini corpus/dev.jsonl:test-edit

The variants wrap the policy's methods in this script; the policy has no such options.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from draftwise import models
from draftwise.backends.base import text_marks
from draftwise.bench.offline import account, replay
from draftwise.bench.suites import prompts
from draftwise.cli.replay import _sources
from draftwise.drafters.ngram import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.loading import LoadOptions, load_backend
from draftwise.policy import auto, estimates

BEGIN, MENU, EXPECTED = auto.AutoPolicy.begin, auto.AutoPolicy.menu, auto.AutoPolicy._expected
RESUME_MIN_COPY = auto.RESUME_MIN_COPY
RATES, UPDATE = estimates.CopyEstimate.rates, estimates.CopyEstimate.update


def shrink(policy, factor: float, below: float | None) -> None:
    """Every lookup estimate's buckets (below: of match lengths under it) keep `factor` of their
    hits and trials: the request's own proposals weigh more."""
    per_table = len(estimates.COPY_BUCKETS)
    cut = per_table if below is None else estimates.copy_bucket(below)
    for est in policy._copies.values():
        for i in range(len(est.hits)):
            if i % per_table < cut:
                est.hits[i] *= factor
                est.trials[i] *= factor
        est._rates = None


def shrinking(factor: float, below: float | None) -> dict:
    def begin(self, drafters, speculation) -> None:
        BEGIN(self, drafters, speculation)
        shrink(self, factor, below)

    return {"begin": begin}


def by_prompt(on_start) -> dict:
    """begin and menu that call on_start(policy, prompt_length) at a request's first step."""

    def begin(self, drafters, speculation) -> None:
        BEGIN(self, drafters, speculation)
        self._prompt_length = None

    def menu(self, state):
        if self._prompt_length is None:
            self._prompt_length = len(state.context)
            on_start(self, self._prompt_length)
        return MENU(self, state)

    return {"begin": begin, "menu": menu}


def capped(cap: int, below: float) -> dict:
    def _expected(self, est, draft, *args):
        out = EXPECTED(self, est, draft, *args)
        return out[: cap + 1] if draft.score < below else out

    return {"_expected": _expected}


class _Split(dict):
    """The lookups' estimates kept apart for short and long prompts (keys get '@short'/'@long')."""

    def __init__(self, policy, cut: int) -> None:
        super().__init__()
        self.policy, self.cut = policy, cut

    def _key(self, key: str) -> str:
        return f"{key}@{'short' if (self.policy._prompt_length or 0) < self.cut else 'long'}"

    def __getitem__(self, key):
        return super().__getitem__(self._key(key))

    def __setitem__(self, key, value) -> None:
        super().__setitem__(self._key(key), value)

    def get(self, key, default=None):
        return super().get(self._key(key), default)


def split(cut: int) -> dict:
    def on_start(policy, length: int) -> None:
        if not isinstance(policy._copies, _Split):
            policy._copies = _Split(policy, cut)

    return by_prompt(on_start)


def short_prompts_shrink(factor: float, cut: int) -> dict:
    return by_prompt(lambda policy, length: shrink(policy, factor, 16) if length < cut else None)


def own_record(factor: float, cut: int) -> dict:
    """Each estimate also keeps the request's own record (`own`: a CopyEstimate fed the same
    updates, from zero at the request's start); a prompt under `cut` tokens prices its short
    matches (below 16) with the earlier requests' part at `factor`: h = factor * hits + (1 -
    factor) * own.hits."""
    nb, below = len(estimates.COPY_BUCKETS), estimates.copy_bucket(16)

    def own(est):
        if not hasattr(est, "own"):
            est.own, est.local = estimates.CopyEstimate(est.priors[:nb], est.prior_weight, est.decay), False
        return est

    def rates(self):
        own(self)
        if not self.local:
            return RATES(self)
        if self._rates is None:
            w, f, mine, out = self.prior_weight, factor, self.own, []
            for i, (h, t, p) in enumerate(zip(self.hits, self.trials, self.priors)):
                if i % nb < below:
                    h, t = f * h + (1 - f) * mine.hits[i], f * t + (1 - f) * mine.trials[i]
                out.append((h + p * w) / (t + w))
            self._rates = out
        return self._rates

    def update(self, length, num_drafted, num_accepted, line_starts=()):
        UPDATE(own(self).own, length, num_drafted, num_accepted, line_starts)
        UPDATE(self, length, num_drafted, num_accepted, line_starts)

    def on_start(policy, length: int) -> None:
        for est in policy._copies.values():
            own(est).own = estimates.CopyEstimate(est.priors[:nb], est.prior_weight, est.decay)
            est._rates = None
        policy._local = length < cut

    patches = by_prompt(on_start)
    menu = patches["menu"]

    def menu_local(self, state):
        out = menu(self, state)  # on_start first, at the request's first step
        for est in self._copies.values():
            if own(est).local != self._local:
                est.local, est._rates = self._local, None
        return out

    return {**patches, "menu": menu_local, "rates": rates, "update": update}


VARIANTS = {
    "base": {},
    "all50": shrinking(0.5, None),
    "short50": shrinking(0.5, 16),
    "short25": shrinking(0.25, 16),
    "cap3": capped(3, 8),
    "split256": split(256),
    "short50p512": short_prompts_shrink(0.5, 512),
    "own25p512": own_record(0.25, 512),
    **{f"resume{n}": {"resume_min_copy": n} for n in (16, 32, 64)},
}


def install(name: str) -> None:
    """The variant's methods in place of the policy's (every other one restored)."""
    patches = VARIANTS[name]
    auto.AutoPolicy.begin = patches.get("begin", BEGIN)
    auto.AutoPolicy.menu = patches.get("menu", MENU)
    auto.AutoPolicy._expected = patches.get("_expected", EXPECTED)
    estimates.CopyEstimate.rates = patches.get("rates", RATES)
    estimates.CopyEstimate.update = patches.get("update", UPDATE)
    auto.RESUME_MIN_COPY = patches.get("resume_min_copy", RESUME_MIN_COPY)


def main(names: list[str], sources: list[str]) -> None:
    backend = load_backend(models.DEFAULT_TARGET, LoadOptions(n_ctx=256))
    tokenizer = backend.tokenizer
    marks = text_marks(tokenizer, backend.vocab_size)
    try:
        for source in sources:
            kinds: dict[int, str] = {}
            if ":" in source:
                split, run = source.split(":")
                results = json.loads((Path(run) / "results.json").read_text())
                pool = prompts.filter_categories(prompts.load_prompts(split), ["edit", "copy", "fim"])
                answers = replay.reference_answers(pool)
                kinds = {json.loads(line)["question_id"]: json.loads(line)["kind"] for line in open(split)}
            else:
                results, pool, answers = _sources(source, None)
            curve = replay.calibrated_curve(results)
            prices = account.run_prices(results, curve)
            runs = []
            for name in names:
                install(name)
                sets = {name: [NgramDrafter(), SuffixDrafter()]}  # afresh: no suffix history carried over
                runs += replay.replay(
                    pool,
                    answers,
                    tokenizer,
                    sets,
                    curve,
                    count_lookups=False,
                    oracle=True,
                    line_ends=marks.line_ends,
                    fences=marks.fences,
                    prices=prices,
                )
            install("base")
            totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
            for r in runs if kinds else ():
                t = totals[(kinds[r.question_id], r.drafters)]
                t[0], t[1], t[2] = t[0] + r.plain_ms, t[1] + r.ms, t[2] + r.oracle_ms
            for (kind, name), (plain, ms, oracle) in sorted(totals.items()):
                print(f"{source} {kind:15} {name:8} policy {plain / ms:.3f}x  optimum {plain / oracle:.3f}x")
            for category, by_set in replay.summarize(runs).items():
                cells = "  ".join(f"{n}: {s['speedup']:.3f}x/{s['oracle_speedup']:.3f}x" for n, s in by_set.items())
                print(f"{source} {category:17} {cells}")
    finally:
        backend.close()


if __name__ == "__main__":
    main(sys.argv[1].split(","), sys.argv[2:])
