"""Drafting for fill in the middle: the lookup drafters see the whole FIM prompt, so a middle that
copies text found only in the suffix or in an extra file is drafted from there, and the answer
stays plain decoding's.

The target is a toy whose greedy answer depends on the last two tokens only: its middle is the
same whatever the suffix holds (the prompt ends "\\n<|fim_middle|>" in every case), so putting
that middle into the suffix or an extra file makes a middle that copies it. The middle repeats no
pair of tokens, so nothing in it can be drafted from itself or the prefix."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.drafters import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.engine import Engine
from draftwise.fim import fim_prompt
from draftwise.types import SamplingParams, SpeculationConfig

PREFIX = "def f(x):\n    "
NUM_TOKENS = 24
SAMPLING = SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True)


def toy_fim_engine() -> Engine:
    model = ToyModel(vocab_size=100, order=2, seed=1, sharpness=3.0)
    characters = np.arange(100) < 89  # tokens 89.. are the toy's synthetic pieces, which text cannot spell
    target = ToyBackend(logits_fn=lambda context: np.where(characters, model.logits(context), -np.inf), vocab_size=100)
    target.tokenizer.fim_token_ids = lambda: {"prefix": 97, "suffix": 98, "middle": 99}
    return Engine(
        target, [NgramDrafter(), SuffixDrafter()], speculation=SpeculationConfig(policy="fixed", max_draft_tokens=8)
    )


@pytest.fixture
def engine():
    return toy_fim_engine()  # fresh: the suffix drafter must not draft from an earlier test's answer


@pytest.fixture(scope="module")
def middle():
    engine = toy_fim_engine()
    ids = fim_prompt(engine.tokenizer, PREFIX, "\n").ids
    result = engine.generate(prompt_ids=ids, sampling=SAMPLING, speculation=SpeculationConfig(enabled=False))
    pairs = list(zip(result.token_ids, result.token_ids[1:]))
    assert len(set(pairs)) == len(pairs) and engine.tokenizer.encode(result.text) == result.token_ids
    return result


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_nothing_to_draft_without_the_copy(engine, middle, drafter):
    ids = fim_prompt(engine.tokenizer, PREFIX, "\n").ids
    result = engine.generate(prompt_ids=ids, sampling=SAMPLING, drafters=[drafter])
    assert result.token_ids == middle.token_ids and result.stats.num_accepted == 0


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
@pytest.mark.parametrize("where", ["suffix", "extra"])
def test_middle_drafted_from_the_suffix_or_an_extra_file(engine, middle, drafter, where):
    text = middle.text
    if where == "suffix":  # the middle reaches code the suffix holds further on
        ids = fim_prompt(engine.tokenizer, PREFIX, f"{text}\n").ids
    else:
        ids = fim_prompt(engine.tokenizer, PREFIX, "\n", extra=[("util.py", text)]).ids
    result = engine.generate(prompt_ids=ids, sampling=SAMPLING, drafters=[drafter])
    assert result.token_ids == middle.token_ids
    # the first two tokens find the copy (n-grams of 2); the rest is drafted and accepted
    assert result.stats.num_accepted >= NUM_TOKENS - 5
    assert result.stats.num_steps <= 5
