"""The Drafter seam's optional parts: what BaseDrafter gives by default (no parallel slots, no
state across requests, nothing reused) and what begin() hands a drafter (the prompt, the
target's tokenizer), so the engine neither probes drafters nor writes into them.
"""

import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.base import BaseDrafter, Drafter
from draftwise.drafters.calls import CallsDrafter
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.drafters.prediction import PredictionDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.engine import Engine
from draftwise.types import ConfigError, Draft, SamplingParams, SpeculationConfig

TARGET = ToyModel(vocab_size=12, order=2, seed=3)


class Echo(BaseDrafter):
    """Proposes the context's last tokens; only the required parts of the seam."""

    name, free = "echo", True

    def propose(self, context, max_tokens, grammar=None):
        return Draft(tuple(context[-max_tokens:]), source=self.name)


def test_a_drafter_without_for_slot_cannot_serve_a_second_slot():
    engine = Engine(ToyBackend(TARGET, slots=2), [Echo()])
    assert engine.slot(0).drafters[0].name == "echo"
    with pytest.raises(ConfigError, match="'echo' cannot serve parallel slots"):
        engine.slot(1)


def test_defaults_keep_no_state_and_reuse_nothing():
    d = Echo()
    assert d.backend is None and d.num_reused_tokens == 0 and d.snapshot() is None
    assert d.propose_tree([1, 2, 1], 2, 4) is None  # chains only
    assert d.acceptance_prior is None and d.catch_up([1, 2, 3, 4]) == 1  # the auto policy's prior; one token fed
    d.restore(d.snapshot())
    result = Engine(ToyBackend(TARGET), [d]).generate(
        prompt_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=6, ignore_eos=True)
    )
    assert len(result.token_ids) == 6 and result.stats.num_draft_reused_tokens == 0


def test_begin_hands_the_prompt_and_the_tokenizer():
    draft = ModelDrafter(ToyBackend(TARGET), name="draft")
    draft.begin(SamplingParams(), SpeculationConfig(), [1, 2, 3, 4], None)
    assert draft.num_prompt_tokens == 4
    calls, tokenizer = CallsDrafter(), ToyBackend(TARGET).tokenizer
    calls.begin(SamplingParams(), SpeculationConfig(), [1], tokenizer)
    assert calls.tokenizer is tokenizer
    own = CallsDrafter(tokenizer=tokenizer)
    own.begin(SamplingParams(), SpeculationConfig(), [1], ToyBackend(TARGET, name="other").tokenizer)
    assert own.tokenizer is tokenizer  # a tokenizer of its own is kept


@pytest.mark.parametrize(
    "drafter",
    [
        ModelDrafter(ToyBackend(TARGET), name="draft"),
        NgramDrafter(),
        SuffixDrafter(),
        GrammarDrafter(),
        PredictionDrafter(),
        CallsDrafter(),
    ],
    ids=lambda d: d.name,
)
def test_every_drafter_has_the_whole_seam(drafter):
    assert isinstance(drafter, Drafter) and isinstance(drafter, BaseDrafter)
    assert drafter.catch_up([1, 2, 3]) >= 1
    assert isinstance(drafter.for_slot(0), type(drafter))
