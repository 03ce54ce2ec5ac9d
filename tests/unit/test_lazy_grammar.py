"""Lazy constraints (tool calls): free text until a trigger, the grammar from the token after it.

The toy target is biased to write the two-token trigger "#<" after some letters, so answers
cross it (drafts do too: the draft model that is the target drafts through it); constrained
speculative decoding must equal constrained plain decoding for every drafter and for auto.
"""

import numpy as np
import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.calibrate import CostCurve
from draftwise.constraints import Constraint, LazyGrammar, compile_constraint
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.engine import Engine
from draftwise.policy.auto import AutoPolicy
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig

VOCAB = 90
BASE = ToyModel(vocab_size=VOCAB, order=2, seed=5, sharpness=3.0)
TOKENS = ToyBackend(BASE).tokenizer
HASH, LT, A, E = (TOKENS.encode(c)[0] for c in "#<ae")
TRIGGER = "#<"
CALLS = Constraint.grammar('start: call (";" call)*\ncall: "(" /[a-c]{1,4}/ ")"')
LAZY = Constraint.lazy(CALLS, TRIGGER)
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7, 8, 9, 5, 6, 7, 8], [10], [A, E]]


def biased(context):
    """The base model, plus: '#' likely after 'a' or 'e', '<' after '#'."""
    row = BASE.logits(context).copy()
    if context and context[-1] in (A, E):
        row[HASH] += 6.0
    if context and context[-1] == HASH:
        row[LT] += 30.0
    return row


def make_engine(policy=None):
    drafters = [
        ModelDrafter(ToyBackend(logits_fn=biased, vocab_size=VOCAB, name="same"), name="same"),
        ModelDrafter(ToyBackend(ToyModel(vocab_size=VOCAB, order=1, seed=5, sharpness=3.0)), name="related"),
        NgramDrafter(1, 3),
        GrammarDrafter(),
    ]
    return Engine(ToyBackend(logits_fn=biased, vocab_size=VOCAB), drafters, policy=policy)


def generate(engine, prompt, speculation, drafters=None, constraint=LAZY, n=60):
    return engine.generate(
        prompt_ids=prompt,
        sampling=SamplingParams(max_tokens=n, constraint=constraint),
        speculation=speculation,
        drafters=drafters,
    )


def reference_greedy(prompt, constraint=LAZY, n=60):
    """Lazy constrained greedy decoding written out: argmax of the unmasked logits until the
    trigger's tokens, then of the grammar-masked ones."""
    inner = compile_constraint(Constraint(constraint.kind, constraint.source), ToyBackend(BASE))
    context, out, on = list(prompt), [], False
    while len(out) < n:
        logits = biased(context)
        if on:
            logits = np.where(inner.allowed(), logits, -np.inf)
        token = int(np.argmax(logits))
        if token == 0:
            break
        if on:
            inner.consume([token])
        out.append(token)
        context.append(token)
        on = on or out[-2:] == [HASH, LT]
    return out


def test_the_reference_crosses_the_trigger():
    texts = [TOKENS.decode(reference_greedy(p)) for p in PROMPTS]
    assert sum(TRIGGER in t for t in texts) >= 2, texts  # else the tests below test nothing
    assert sum(TRIGGER not in t for t in texts) >= 1, texts
    for text in texts:
        if TRIGGER in text:
            calls = text.split(TRIGGER, 1)[1]
            assert all(c.startswith("(") and c.endswith(")") for c in calls.split(";")), text


def test_plain_lazy_decoding_is_the_reference():
    engine = make_engine()
    for prompt in PROMPTS:
        result = generate(engine, prompt, SpeculationConfig(enabled=False))
        assert result.token_ids == reference_greedy(prompt)


@pytest.mark.parametrize("drafter", ["same", "related", "ngram", "grammar"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_lazy_greedy_equivalence(drafter, k):
    engine = make_engine()
    for prompt in PROMPTS:
        result = generate(engine, prompt, SpeculationConfig(policy="fixed", max_draft_tokens=k), drafters=[drafter])
        assert result.token_ids == reference_greedy(prompt)
        if drafter == "same":
            assert result.stats.acceptance_rate == 1.0  # its drafts cross the trigger and are all kept


def test_lazy_greedy_equivalence_auto():
    auto = AutoPolicy(
        target_cost=CostCurve.linear(10.0, 1.0),
        draft_costs={"same": CostCurve.linear(0.5, 0.5), "related": CostCurve.linear(0.5, 0.5)},
    )
    engine = make_engine(policy=auto)
    for prompt in PROMPTS:
        assert generate(engine, prompt, SpeculationConfig(policy="auto")).token_ids == reference_greedy(prompt)


def test_a_window_across_the_trigger_is_masked_row_by_row():
    grammar = compile_constraint(LAZY, ToyBackend(BASE))
    assert isinstance(grammar, LazyGrammar)
    draft = TOKENS.encode("x#<(a")
    rows = grammar.masks(draft)  # [6, V]: after "", x, #, <, (, a
    assert [int(r.sum()) for r in rows] == [VOCAB, VOCAB, VOCAB, 1, 3, 4]
    assert grammar.valid_prefix(TOKENS.encode("x#<(ab)z")) == 7  # "z" after a complete call
    assert grammar.valid_prefix(TOKENS.encode("x#<x")) == 3
    grammar.consume(TOKENS.encode("x#"))
    assert not grammar.triggered and grammar.forced(5) == []
    fork = grammar.fork()
    grammar.consume(TOKENS.encode("<"))  # the trigger split over two commits still fires
    assert grammar.triggered and grammar.forced(5) == TOKENS.encode("(")
    assert not fork.triggered  # a fork moves on its own


def test_a_long_trigger_fires_token_by_token():
    trigger = "<tool_call>"  # 11 tokens in the toy vocabulary
    grammar = compile_constraint(Constraint.lazy(CALLS, trigger), ToyBackend(BASE))
    text = TOKENS.encode("ab" + trigger + "(a);(b)")
    assert grammar.valid_prefix(text + TOKENS.encode("x")) == len(text)
    for token in text[:-4]:
        grammar.consume([token])
    assert grammar.triggered


def test_tool_choice_none_forbids_the_trigger():
    grammar = compile_constraint(Constraint.without(TRIGGER), ToyBackend(BASE))
    assert grammar.valid_prefix(TOKENS.encode("ab#<c")) == 3
    rows = grammar.masks(TOKENS.encode("a#"))
    assert not rows[2, LT] and rows[1, LT] and rows.sum() == 3 * VOCAB - 1
    engine = make_engine()
    for prompt in PROMPTS:
        for spec in (SpeculationConfig(enabled=False), SpeculationConfig(policy="fixed", max_draft_tokens=4)):
            ids = generate(engine, prompt, spec, ["same"], Constraint.without(TRIGGER)).token_ids
            assert all(ids[i : i + 2] != [HASH, LT] for i in range(len(ids)))


def test_lazy_constraints_validate():
    with pytest.raises(ConfigError):
        Constraint.lazy(CALLS, "")
    with pytest.raises(ConfigError):
        Constraint("text")
