"""Structured output on the exact toy backend: constrained speculative output equals
constrained plain output for every drafter x k, plain constrained decoding equals a
reference loop (argmax of the masked logits), answers match their constraint, forced
tokens cost no decision, and bad constraints fail clearly without harming the engine.
"""

import json
import re

import jsonschema
import numpy as np
import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.calibrate import CostCurve
from draftwise.constraints import Constraint, ConstraintError, compile_constraint
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.base import BaseDrafter
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.engine import Engine
from draftwise.policy.auto import AutoPolicy
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig

VOCAB = 90  # the whole toy alphabet: letters, digits, JSON punctuation
TARGET = ToyModel(vocab_size=VOCAB, order=2, seed=3, sharpness=3.0)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    },
    "required": ["name", "kind", "age", "tags"],
    "additionalProperties": False,
}
REGEX = r"(yes|no): [a-z]{2,5}( [0-9]{1,3}){2}\."
CONSTRAINTS = {
    "schema": Constraint.json_schema(SCHEMA),
    "regex": Constraint.regex(REGEX),
    "grammar": Constraint.grammar('start: "(" item ("," item)* ")"\nitem: /[a-c]{1,3}/ | "x"'),
}
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7, 8, 9, 5, 6, 7, 8], [10]]


def make_engine(policy=None):
    drafters = [
        ModelDrafter(ToyBackend(TARGET, name="same"), name="same"),
        ModelDrafter(ToyBackend(ToyModel(vocab_size=VOCAB, order=1, seed=3, sharpness=3.0)), name="related"),
        NgramDrafter(1, 3),
        GrammarDrafter(),
    ]
    return Engine(ToyBackend(TARGET), drafters, policy=policy)


def generate(engine, prompt, constraint, speculation, drafters=None, n=80, **sampling):
    return engine.generate(
        prompt_ids=prompt,
        sampling=SamplingParams(max_tokens=n, constraint=constraint, **sampling),
        speculation=speculation,
        drafters=drafters,
    )


def reference_greedy(prompt, constraint, n=80):
    """Constrained greedy decoding written out: argmax of the grammar-masked logits."""
    backend = ToyBackend(TARGET)
    grammar = compile_constraint(constraint, backend)
    context, out = list(prompt), []
    while len(out) < n:
        logits = np.where(grammar.allowed(), TARGET.logits(context), -np.inf)
        token = int(np.argmax(logits))
        if token == 0:
            break
        grammar.consume([token])
        context.append(token)
        out.append(token)
    return out


def check_valid(engine, name, result):
    text = engine.tokenizer.decode(result.token_ids)
    assert result.finish_reason == "stop", text
    if name == "schema":
        jsonschema.validate(json.loads(text), SCHEMA)
    elif name == "regex":
        assert re.fullmatch(REGEX, text), text


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
def test_plain_constrained_decoding_is_the_masked_argmax(name):
    engine = make_engine()
    for prompt in PROMPTS:
        result = generate(engine, prompt, CONSTRAINTS[name], SpeculationConfig(enabled=False))
        assert result.token_ids == reference_greedy(prompt, CONSTRAINTS[name])
        check_valid(engine, name, result)
        assert result.stats.num_forced_tokens == 0  # plain decoding: one token per forward


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
@pytest.mark.parametrize("drafter", ["same", "related", "ngram", "grammar"])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_constrained_greedy_equivalence(name, drafter, k):
    engine = make_engine()
    for prompt in PROMPTS:
        expected = generate(engine, prompt, CONSTRAINTS[name], SpeculationConfig(enabled=False)).token_ids
        result = generate(
            engine, prompt, CONSTRAINTS[name], SpeculationConfig(policy="fixed", max_draft_tokens=k), drafters=[drafter]
        )
        assert result.token_ids == expected
        check_valid(engine, name, result)
        if drafter == "same":
            assert result.stats.acceptance_rate == 1.0  # the draft drafts under the grammar too


def test_constrained_greedy_equivalence_auto():
    auto = AutoPolicy(
        target_cost=CostCurve.linear(10.0, 1.0),
        draft_costs={"same": CostCurve.linear(0.5, 0.5), "related": CostCurve.linear(0.5, 0.5)},
    )
    engine = make_engine(policy=auto)
    for name, constraint in CONSTRAINTS.items():
        for prompt in PROMPTS:
            expected = generate(engine, prompt, constraint, SpeculationConfig(enabled=False)).token_ids
            result = generate(engine, prompt, constraint, SpeculationConfig(policy="auto"))
            assert result.token_ids == expected
            check_valid(engine, name, result)


def test_forced_tokens_are_committed_without_a_decision():
    engine = Engine(ToyBackend(TARGET))  # no drafter at all: the grammar alone forces the keys
    result = generate(engine, [1, 2], CONSTRAINTS["schema"], SpeculationConfig(policy="fixed"))
    assert result.token_ids == reference_greedy([1, 2], CONSTRAINTS["schema"])
    stats = result.stats
    # '{"name": "' alone is 10 forced tokens; the keys and separators after it are forced too.
    assert stats.num_forced_tokens >= 30
    assert stats.num_steps == len(result.token_ids) + 1 - stats.num_forced_tokens  # +1: EOS
    assert stats.num_masks > 0 and stats.mask_ms > 0


def test_draft_tokens_outside_the_grammar_are_cut_before_verification():
    class Wrong(BaseDrafter):
        name, free = "wrong", True

        def propose(self, context, max_tokens, grammar=None):
            from draftwise.types import Draft

            return Draft((0,) * max_tokens, source=self.name)  # EOS: never allowed mid-answer

        def accept(self, n):
            pass

    engine = Engine(ToyBackend(TARGET), [Wrong()])
    expected = generate(engine, [1, 2], CONSTRAINTS["regex"], SpeculationConfig(enabled=False)).token_ids
    result = generate(engine, [1, 2], CONSTRAINTS["regex"], SpeculationConfig(policy="fixed", max_draft_tokens=4))
    assert result.token_ids == expected
    assert result.stats.num_drafted == 0


def test_runaway_whitespace_is_impossible_in_json():
    """A model that wants whitespace (and nothing else) still ends its JSON object."""
    tokenizer = ToyBackend(TARGET).tokenizer
    space, newline = tokenizer.encode(" ")[0], tokenizer.encode("\n")[0]

    def loves_whitespace(context):
        row = TARGET.logits(context).copy()
        row[[space, newline]] += 50.0
        return row

    engine = Engine(ToyBackend(logits_fn=loves_whitespace, vocab_size=VOCAB))
    result = generate(engine, [1], Constraint.json_object(), SpeculationConfig(enabled=False), n=200)
    text = tokenizer.decode(result.token_ids)
    assert result.finish_reason == "stop", text
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Constraint.json_schema('{"type": "object"'), "not valid JSON"),
        (lambda: Constraint.json_schema("[1, 2]"), "must be an object"),
        (lambda: Constraint.json_schema({"type": 5}), "type must be a string"),
        (lambda: Constraint.regex("[a-"), "unclosed character class"),
        (lambda: Constraint.grammar("start: undefined_rule"), "undefined_rule"),
        (lambda: Constraint("xml", "<a/>"), "constraint kind must be one of"),
        (lambda: Constraint.regex(""), "is empty"),
    ],
)
def test_bad_constraints_fail_clearly_and_the_next_request_is_unconstrained(make, message):
    engine = make_engine()
    with pytest.raises(ConfigError, match=message):
        generate(engine, [1, 2], make(), SpeculationConfig(enabled=False))
    plain = engine.generate(
        prompt_ids=[1, 2], sampling=SamplingParams(max_tokens=20), speculation=SpeculationConfig(enabled=False)
    )
    assert (
        plain.token_ids
        == Engine(ToyBackend(TARGET))
        .generate(
            prompt_ids=[1, 2], sampling=SamplingParams(max_tokens=20), speculation=SpeculationConfig(enabled=False)
        )
        .token_ids
    )


def test_constraint_errors_are_config_errors():
    assert issubclass(ConstraintError, ConfigError)
