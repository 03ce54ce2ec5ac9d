"""Prefix-suffix-middle against suffix-prefix-middle prompts: which one a model completes better.

In SPM order (llama.cpp's --spm-infill) the typed part of the line comes last, so while a user
types everything before it stays cached and each keystroke reads a few tokens instead of the
line and the whole suffix; that pays only if the model was trained to complete that way. Each
`fim` suite cut is completed greedily (speculation off, the prompt read afresh) in both orders,
cut as /infill cuts it, and scored against the removed text (exact match, edit similarity;
docs/code-completion.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from draftwise.bench.suites.fim import quality
from draftwise.bench.suites.prompts import load_suite
from draftwise.fim import FimBudget, fim_prompt
from draftwise.types import SamplingParams, SpeculationConfig

LAYOUTS = ("psm", "spm")


@dataclass(frozen=True)
class Completion:
    """One cut completed in one order: its scores, its length and the middle itself."""

    cut: int
    layout: str
    exact_match: bool
    edit_similarity: float
    tokens: int
    middle: str


@dataclass(frozen=True)
class LayoutScore:
    exact: int
    cuts: int
    mean_edit_similarity: float


@dataclass(frozen=True)
class FimLayouts:
    psm: LayoutScore
    spm: LayoutScore
    completions: tuple[Completion, ...]


def measure(
    target: str,
    max_tokens: int = 64,
    num_cuts: int | None = None,
    on_completion: Callable[[Completion], None] | None = None,
) -> FimLayouts:
    """Every `fim` suite cut (or the first `num_cuts`) in both orders; `on_completion` after each."""
    from draftwise.loading import load_engine

    if max_tokens < 1 or (num_cuts is not None and num_cuts < 1):
        raise ValueError(f"max_tokens and num_cuts must be at least 1, got {max_tokens} and {num_cuts}")
    engine = load_engine(target, draft=None, speculation=SpeculationConfig(enabled=False))
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    done: list[Completion] = []
    try:
        for cut in load_suite("fim")[:num_cuts]:
            for layout in LAYOUTS:
                ids = fim_prompt(
                    engine.tokenizer, cut.turns[0], cut.suffix, budget=FimBudget(), spm=layout == "spm"
                ).ids
                engine.target.reset()  # nothing of the other order's read is reused
                result = engine.generate(prompt_ids=ids, sampling=sampling)
                scores = quality(result.text, cut.reference)
                one = Completion(
                    cut=cut.question_id,
                    layout=layout,
                    exact_match=bool(scores["exact_match"]),
                    edit_similarity=float(scores["edit_similarity"]),
                    tokens=len(result.token_ids),
                    middle=result.text,
                )
                done.append(one)
                if on_completion is not None:
                    on_completion(one)
    finally:
        engine.close()

    def score(layout: str) -> LayoutScore:
        mine = [c for c in done if c.layout == layout]
        return LayoutScore(
            exact=sum(c.exact_match for c in mine),
            cuts=len(mine),
            mean_edit_similarity=round(statistics.mean(c.edit_similarity for c in mine), 4),
        )

    return FimLayouts(psm=score("psm"), spm=score("spm"), completions=tuple(done))
