"""n > 1: the choices of one request are independent samples of the target's distribution.

Each request asks for N_CHOICES answers of 3 tokens; its choices get the server's seed streams
(server.choices.choice_seed) and are decoded side by side in slots with speculation (a draft
model, k = 2). Checked on the exact toy backend: every choice position follows the exact joint
distribution (chi-square), choices 0 and 1 are independent (a contingency test on their first
tokens, and the rate at which they agree against sum p(s)^2), and a negative control that gives
every choice the request's own seed (the bug of copies that share a random stream) is caught.
"""

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from draftwise.backends.toy import ToyBackend
from draftwise.batching import Batcher
from draftwise.drafters import ModelDrafter
from draftwise.engine import Engine
from draftwise.server.choices import choice_seed
from draftwise.types import SamplingParams, SpeculationConfig
from tests.statistical.test_sequence_level import DRAFT, LENGTH, PROMPT, TARGET, VOCAB, check, exact_joint

pytestmark = pytest.mark.slow  # thousands of sampled answers

N_CHOICES, NUM_REQUESTS = 3, 1_500


def sample_choices(seed_of) -> list[list[tuple[int, ...]]]:
    """NUM_REQUESTS requests of N_CHOICES choices each; seed_of(request seed, copy) -> a choice's seed."""
    engine = Engine(
        ToyBackend(TARGET, slots=N_CHOICES), [ModelDrafter(ToyBackend(DRAFT, slots=N_CHOICES), name="draft")]
    )
    speculation = SpeculationConfig(policy="fixed", max_draft_tokens=2)
    gens = []
    for request in range(NUM_REQUESTS):
        for copy in range(N_CHOICES):
            sampling = SamplingParams(temperature=1.0, seed=seed_of(request, copy), max_tokens=LENGTH, ignore_eos=True)
            gens.append(engine.stream(prompt_ids=PROMPT, sampling=sampling, speculation=speculation))
    results = Batcher(engine).run(gens)
    answers = [tuple(r.token_ids) for r in results]
    return [answers[i : i + N_CHOICES] for i in range(0, len(answers), N_CHOICES)]


def independence_p(requests) -> float:
    table = np.zeros((VOCAB, VOCAB))
    for choices in requests:
        table[choices[0][0], choices[1][0]] += 1
    table = table[table.sum(1) > 0][:, table.sum(0) > 0]
    return chi2_contingency(table).pvalue


def test_choices_are_independent_samples_of_the_target():
    requests = sample_choices(choice_seed)
    joint = exact_joint(TARGET, SamplingParams(temperature=1.0))
    for copy in range(N_CHOICES):  # each choice position follows the target
        counts: dict[tuple[int, ...], int] = {}
        for choices in requests:
            counts[choices[copy]] = counts.get(choices[copy], 0) + 1
        check(counts, joint)
    assert independence_p(requests) > 1e-3
    agree = np.mean([c[0] == c[1] for c in requests])
    expected = sum(p * p for p in joint.values())
    assert abs(agree - expected) < 4 * np.sqrt(expected * (1 - expected) / NUM_REQUESTS)


def test_detects_choices_that_share_a_random_stream():
    """Negative control: every choice seeded with the request's own seed answers alike."""
    requests = sample_choices(lambda seed, copy: seed)
    assert independence_p(requests) < 1e-3
