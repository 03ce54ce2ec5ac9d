"""Sampled requests inside a batch: 3-token answers follow the exact joint distribution of the
toy target while they share forwards with other requests (a draft model, prompt lookup and
plain decoding side by side, joining and leaving as slots free up)."""

from draftwise.backends.toy import ToyBackend
from draftwise.batching import Batcher
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.engine import Engine
from draftwise.types import SamplingParams, SpeculationConfig
from tests.statistical.test_sequence_level import DRAFT, LENGTH, PROMPT, TARGET, check, exact_joint

NUM_SAMPLES = 6_000


def test_joint_distribution_under_batching():
    engine = Engine(
        ToyBackend(TARGET, slots=4), [NgramDrafter(1, 2), ModelDrafter(ToyBackend(DRAFT, slots=4), name="draft")]
    )
    params = SamplingParams(temperature=1.0)
    configs = [
        (SpeculationConfig(policy="fixed", max_draft_tokens=2), ["draft"]),
        (SpeculationConfig(policy="fixed", max_draft_tokens=3), ["ngram"]),
        (SpeculationConfig(enabled=False), None),
    ]
    gens = []
    for seed in range(NUM_SAMPLES):
        speculation, drafters = configs[seed % len(configs)]
        sampling = SamplingParams(temperature=1.0, seed=seed, max_tokens=LENGTH, ignore_eos=True)
        gens.append(engine.stream(prompt_ids=PROMPT, sampling=sampling, speculation=speculation, drafters=drafters))
    results = Batcher(engine).run(gens)
    assert engine.target.num_batches > NUM_SAMPLES // 4  # requests really shared forwards
    joint = exact_joint(TARGET, params)
    for i in range(len(configs)):  # each kind of request on its own
        counts = {}
        for r in results[i :: len(configs)]:
            counts[tuple(r.token_ids)] = counts.get(tuple(r.token_ids), 0) + 1
        check(counts, joint)
