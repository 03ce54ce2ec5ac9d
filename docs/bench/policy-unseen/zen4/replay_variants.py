"""Replay a corpus split's reference answers (edits and copies) through the auto policy and
variants of it, priced at a bench run's forwards (or a calibration file's curve), and print the
policy's speed and the hindsight optimum's per edit kind. Variants (the README's table):

- "base": the policy as it is.
- "chain": a copy that resumed after an edit records its own break however short it held, so the
  next proposal near that break is a resume too (the policy records breaks of 48+-token copies).
- "near1": a resume proposed on the step right after the break (the answer has written one token
  of the edit) is rated by an estimate of its own ("resume_near", the lookups' priors).
- "chain_near1": both.
- "ctx128": a proposal up to 128 tokens after a break may be a resume (RESUME_CONTEXT, 64).
- "bctx": the two tokens before a long copy's break are recorded like a diverged token, and a
  later proposal's token after the same two is rated by that record.

    python docs/bench/policy-unseen/zen4/replay_variants.py base,chain corpus/dev.jsonl test-edit/results.json
    python docs/bench/policy-unseen/zen4/replay_variants.py base,chain specbench-10   # a run's own answers

The variants wrap the policy's methods in this script; the policy has no such options.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from draftwise import models
from draftwise.backends.base import common_prefix_length, text_marks
from draftwise.bench.offline import account, replay
from draftwise.bench.suites import prompts
from draftwise.cli.replay import _sources
from draftwise.drafters.ngram import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.loading import LoadOptions, load_backend
from draftwise.policy import auto
from draftwise.policy.estimates import expected_tokens

Policy = auto.AutoPolicy
METHODS = ("_score_shadows", "_after_break", "menu", "_diverged_at", "_expected")
ORIGINAL = {name: getattr(Policy, name) for name in METHODS}
CONSTANTS = {name: getattr(auto, name) for name in ("RESUME_SOURCE", "RESUME_CONTEXT", "RESUME_MIN_COPY")}


def _key_at(diverged: dict, tail: tuple, tokens, j: int):
    """The record that rates token j of a proposal following `tail`: the token's own, else the
    pair of tokens before it."""
    if tokens[j] in diverged:
        return tokens[j]
    seq = (*tail, *tokens)
    return seq[j + len(tail) - 2], seq[j + len(tail) - 1]


def _first_recorded(diverged: dict, tail: tuple, tokens) -> int:
    seq, off = (*tail, *tokens), len(tail)
    for j, t in enumerate(tokens):
        if t in diverged or (j + off >= 2 and (seq[j + off - 2], seq[j + off - 1]) in diverged):
            return j
    return -1


def scorer(chain: bool, pairs: bool):
    """_score_shadows, with a resumed copy's break recorded whatever its length (chain) and the
    two tokens before a long copy's break recorded beside the diverged token (pairs)."""

    def _score_shadows(self, context) -> None:
        pending, diverged = [], self._diverged
        for shadow in self._shadows:
            known = context[shadow.start : shadow.start + len(shadow.token_ids)]
            matched = common_prefix_length(known, shadow.token_ids)
            broke = matched < len(known)
            if not broke and matched < len(shadow.token_ids):
                pending.append(shadow)
                continue
            judged = matched + 1 if broke else matched
            at = shadow.diverged_at
            if 0 <= at < judged:
                tail = tuple(context[max(0, shadow.start - 2) : shadow.start]) if pairs else ()
                record = diverged[_key_at(diverged, tail, shadow.token_ids, at) if pairs else shadow.token_ids[at]]
                record[0] += at < matched
                record[1] += 1.0
                if at == matched:
                    self._copies[shadow.key].update(shadow.length, at, at, shadow.line_starts)
                    continue
            self._copies[shadow.key].update(shadow.length, judged, matched, shadow.line_starts)
            if broke and shadow.length + matched >= auto.DIVERGED_MIN_COPY:
                diverged.setdefault(shadow.token_ids[matched], [0.0, 0.0])
                if pairs and shadow.start + matched >= 2:
                    diverged.setdefault(tuple(context[shadow.start + matched - 2 : shadow.start + matched]), [0.0, 0.0])
            held = shadow.length + matched >= auto.RESUME_MIN_COPY or (chain and shadow.key.endswith(":resume"))
            if broke and held and shadow.origin >= 0:
                self._breaks[shadow.base] = (shadow.origin + matched, shadow.start + matched)
        self._shadows = pending[-auto.MAX_SHADOWS :]

    return _score_shadows


def near(n: int):
    def _after_break(self, key, draft, context_len) -> str:
        out = ORIGINAL["_after_break"](self, key, draft, context_len)
        return "resume_near" if out == "resume" and context_len - self._breaks[key][1] <= n else out

    return _after_break


def menu(self, state):
    self._tail = tuple(state.context[-2:])
    return ORIGINAL["menu"](self, state)


def diverged_at(self, draft) -> int:
    return _first_recorded(self._diverged, self._tail, draft.token_ids) if self._diverged else -1


def expected(self, est, draft, at, starts):
    if at < 0:
        return est.expected_tokens(draft.score, len(draft), starts)
    hits, trials = self._diverged[_key_at(self._diverged, self._tail, draft.token_ids, at)]
    rates = [est.rate(draft.score, j, j < len(starts) and starts[j]) for j in range(len(draft))]
    rates[at] = (hits + auto.DIVERGED_PRIOR * auto.DIVERGED_WEIGHT) / (trials + auto.DIVERGED_WEIGHT)
    return expected_tokens(rates)


VARIANTS = {
    "base": {},
    "chain": {"_score_shadows": scorer(True, False)},
    "near1": {"_after_break": near(1)},
    "chain_near1": {"_score_shadows": scorer(True, False), "_after_break": near(1)},
    "ctx128": {"RESUME_CONTEXT": 128},
    "bctx": {"_score_shadows": scorer(False, True), "menu": menu, "_diverged_at": diverged_at, "_expected": expected},
}


def install(name: str) -> None:
    """The variant's methods and constants in place of the policy's (every other one restored)."""
    patches = VARIANTS[name]
    for attr, method in ORIGINAL.items():
        setattr(Policy, attr, patches.get(attr, method))
    for attr, value in CONSTANTS.items():
        setattr(auto, attr, patches.get(attr, value))


def replay_lookups(name: str, pool, answers, tokenizer, marks, curve, prices=None) -> list:
    """The answers replayed with the lookups (ngram, suffix) under the policy as patched now, and
    the hindsight optimum beside it (lookups free)."""
    return replay.replay(
        pool,
        answers,
        tokenizer,
        {name: [NgramDrafter(), SuffixDrafter()]},
        curve,
        count_lookups=False,
        oracle=True,
        line_ends=marks.line_ends,
        fences=marks.fences,
        prices=prices,
    )


def main(names: list[str], split: str, prices_from: str = "") -> None:
    backend = load_backend(models.DEFAULT_TARGET, LoadOptions(n_ctx=256))
    tokenizer = backend.tokenizer
    marks = text_marks(tokenizer, backend.vocab_size)
    if Path(split).is_dir():  # a bench run: its own answers at its own forwards
        data, pool, answers = _sources(split, None)
        kinds = {p.question_id: p.category for p in pool}
    else:
        data = json.loads(Path(prices_from).read_text())
        pool = prompts.filter_categories(prompts.load_prompts(split), ["edit", "copy"])
        answers = replay.reference_answers(pool)
        kinds = {r["question_id"]: r["kind"] for r in map(json.loads, open(split))}
    curve = replay.calibrated_curve(data)
    prices = account.run_prices(data, curve) if "records" in data else None
    try:
        for name in names:
            install(name)
            runs = replay_lookups(name, pool, answers, tokenizer, marks, curve, prices)
            install("base")
            totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
            for r in runs:
                t = totals[kinds[r.question_id]]
                t[0], t[1], t[2] = t[0] + r.plain_ms, t[1] + r.ms, t[2] + r.oracle_ms
            for kind, (plain, ms, oracle) in sorted(totals.items()):
                print(f"{name:12} {kind:15} policy {plain / ms:.3f}x  optimum {plain / oracle:.3f}x")
            for category, by_set in replay.summarize(runs).items():
                s = by_set[name]
                print(f"{name:12} {category:15} {s['speedup']:.3f}x / {s['oracle_speedup']:.3f}x")
    finally:
        backend.close()


if __name__ == "__main__":
    main(sys.argv[1].split(","), *sys.argv[2:4])
