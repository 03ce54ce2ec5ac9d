"""Greedy equivalence on the real default target (Qwen2.5-Coder 1.5B) with SmolLM2-135M-Instruct,
a draft of another vocabulary (drafters/crossvocab.py), drafting: output equal to plain decoding,
or first diverging at a near tie that batching moves (test_real_pair.py's MARGIN_BOUND, the plain
run's runner-up)."""

from __future__ import annotations

import pytest
from integration.test_real_pair import MARGIN_BOUND, plain_with_margins

from draftwise import models
from draftwise.types import SamplingParams, SpeculationConfig

# slow: loads the real target (1.5B GGUF) and SmolLM2 and decodes with them
pytestmark = [pytest.mark.integration, pytest.mark.slow]

NUM_TOKENS = 48
PROMPTS = ["Explain in two sentences what a hash map is.", "What is 17 times 23? Show the steps."]


@pytest.fixture(scope="module")
def engine():
    from draftwise.drafters.crossvocab import CrossVocabDrafter
    from draftwise.loading import LoadOptions, load_engine

    try:
        target, draft = models.resolve(models.DEFAULT_TARGET), models.resolve(models.SMOLLM2)
    except models.ModelError as exc:
        pytest.skip(f"the models could not be fetched: {exc}")
    # policy="fixed": the draft is tested whether or not it could pay on this host.
    engine = load_engine(
        str(target), str(draft), options=LoadOptions(n_ctx=2048), speculation=SpeculationConfig(policy="fixed")
    )
    assert isinstance(engine.drafters[0], CrossVocabDrafter)
    yield engine
    engine.target.close()
    engine.drafters[0].backend.close()


def test_greedy_equivalence_real_target_smollm2(engine):
    prompt_mode = engine.drafters[0].prompt_mode  # the default; the tiny GGUF test covers both
    speculation = SpeculationConfig(policy="fixed", max_draft_tokens=4)
    divergences, num_drafted, num_accepted = [], 0, 0
    for prompt in PROMPTS:
        prompt_ids = engine.encode_prompt(messages=[{"role": "user", "content": prompt}])
        expected, margins, runners_up = plain_with_margins(engine, prompt_ids, NUM_TOKENS)
        result = engine.generate(
            prompt_ids=prompt_ids, sampling=SamplingParams(max_tokens=NUM_TOKENS), speculation=speculation
        )
        num_drafted += result.stats.num_drafted
        num_accepted += result.stats.num_accepted
        got = result.token_ids
        if got != expected:
            pos = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            margin = margins[pos] if pos < len(margins) else float("nan")
            divergences.append((prompt[:30], pos, margin, pos < len(runners_up) and got[pos] == runners_up[pos]))
    print(f"\n{prompt_mode}: {num_accepted}/{num_drafted} drafted tokens accepted; divergences {divergences}")
    assert all(margin < MARGIN_BOUND and runner_up for _, _, margin, runner_up in divergences), divergences
    assert num_accepted > 0, "no draft token accepted: the test would prove little"
