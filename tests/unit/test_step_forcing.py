"""Forced tokens at max_tokens: when the grammar forces a run that max_tokens cuts, speculative
decoding (which commits forced tokens without a decision) ends with the same tokens and the same
grammar state as plain constrained decoding, with logprobs asked for or not, and the text is a
prefix the grammar admits.
"""

import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.constraints import Constraint, compile_constraint
from draftwise.engine import Engine
from draftwise.types import SamplingParams, SpeculationConfig

TARGET = ToyModel(vocab_size=40, order=2, seed=5, sharpness=2.0)
# One free letter, then "abcdefg" forced token by token, then one more free letter.
CONSTRAINT = Constraint.regex("[a-c]abcdefg[a-c]")
PROMPT = [1, 2, 3]


def run(speculation: SpeculationConfig, max_tokens: int, logprobs: int | None):
    engine = Engine(ToyBackend(TARGET))
    sampling = SamplingParams(max_tokens=max_tokens, constraint=CONSTRAINT, logprobs=logprobs)
    gen = engine.stream(prompt_ids=PROMPT, sampling=sampling, speculation=speculation)
    for _ in gen:
        pass
    return engine, gen.result, gen.request.grammar


@pytest.mark.parametrize("logprobs", [None, 0])
@pytest.mark.parametrize("max_tokens", [2, 3, 5, 8])  # inside the forced run, and at its end
def test_forcing_into_max_tokens_equals_plain(max_tokens, logprobs):
    _, plain, plain_grammar = run(SpeculationConfig(enabled=False), max_tokens, logprobs)
    engine, spec, spec_grammar = run(SpeculationConfig(policy="fixed"), max_tokens, logprobs)
    assert spec.token_ids == plain.token_ids
    assert len(spec.token_ids) == max_tokens
    # The forced run is taken without decisions, but for the last token when logprobs are asked.
    assert spec.stats.num_forced_tokens == (max_tokens - 1 if logprobs is None else max_tokens - 2)
    text = engine.tokenizer.decode(spec.token_ids)
    assert text[0] in "abc" and text[1:] == "abcdefg"[: max_tokens - 1], text
    # The grammar stands where the tokens left it: both admit exactly the same next tokens.
    reference = compile_constraint(CONSTRAINT, ToyBackend(TARGET))
    reference.consume(spec.token_ids)
    assert (spec_grammar.allowed() == reference.allowed()).all()
    assert (plain_grammar.allowed() == reference.allowed()).all()
    if logprobs is not None:
        assert [e.token for e in spec.logprobs] == spec.token_ids
