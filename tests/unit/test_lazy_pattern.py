"""A lazy constraint's second, textual trigger (PatternTrigger): free text until a regex matches
the answer's text, then a grammar that reads the match itself, exact under speculation.

The toy target is biased to write '{"ab' (the pattern's start) after 'a' or 'e' and, as in
test_lazy_grammar.py, the token trigger "#<" elsewhere; greedy speculative decoding under the
lazy constraint with both triggers must equal greedy decoding written out, for every drafter
and k, with drafts that cross the pattern (the draft model that is the target drafts through it).
"""

import re

import numpy as np
import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.constraints import Constraint, LazyGrammar, PatternTrigger, compile_constraint
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.engine import Engine
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig
from tests.unit.test_lazy_grammar import CALLS, HASH, LT, TRIGGER, VOCAB

BASE = ToyModel(vocab_size=VOCAB, order=2, seed=11, sharpness=3.0)
TOKENS = ToyBackend(BASE).tokenizer
PATTERN = r'\{"(?:abc|ab)"'  # names "ab" and "abc": the closing quote tells them apart
FROM_PATTERN = Constraint.grammar('start: "{\\"" ("abc" | "ab") "\\":" /[a-c]{1,4}/ "}"')
LAZY = Constraint.lazy(CALLS, TRIGGER, pattern=PATTERN, from_pattern=FROM_PATTERN)
PROMPTS = [[1], [3], [6], [24], [5, 5]]  # the pattern, "#<", neither, the pattern at once, late
NUDGES = {"a": "{", "e": "{", "{": '"', '{"': "a", '{"a': "b", '{"ab': '"', "c": "#", "#": "<"}
STRENGTH = {"a": 5.0, "e": 5.0, '{"ab': 6.0, "c": 4.0}  # the rest +30: once begun, the prefix goes on


def biased(context):
    """The base model, nudged to begin the pattern ('{"ab') after 'a'/'e' and '#<' after 'c';
    after '{"ab' the base model chooses between 'c', '"' and anything else."""
    row = BASE.logits(context).copy()
    text = TOKENS.decode(context[-4:])
    for tail in sorted(NUDGES, key=len, reverse=True):
        if text.endswith(tail):
            row[TOKENS.encode(NUDGES[tail])[0]] += STRENGTH.get(tail, 30.0)
            break
    return row


def make_engine():
    drafters = [
        ModelDrafter(ToyBackend(logits_fn=biased, vocab_size=VOCAB, name="same"), name="same"),
        ModelDrafter(ToyBackend(ToyModel(vocab_size=VOCAB, order=1, seed=11, sharpness=3.0)), name="related"),
        NgramDrafter(1, 3),
        GrammarDrafter(),
    ]
    return Engine(ToyBackend(logits_fn=biased, vocab_size=VOCAB), drafters)


def reference_greedy(prompt, n=60):
    """Greedy decoding under LAZY written out: unmasked argmax until "#<" (then CALLS from the
    next token) or until the text matches PATTERN (then FROM_PATTERN, fed the match's text)."""
    backend = ToyBackend(BASE)
    context, out, grammar = list(prompt), [], None
    while len(out) < n:
        logits = biased(context)
        if grammar is not None:
            logits = np.where(grammar.allowed(), logits, -np.inf)
        token = int(np.argmax(logits))
        if token == 0:
            break
        out.append(token)
        context.append(token)
        if grammar is not None:
            grammar.consume([token])
        elif out[-2:] == [HASH, LT]:
            grammar = compile_constraint(CALLS, backend)
        elif match := re.search(PATTERN, TOKENS.decode(out)):
            grammar = compile_constraint(FROM_PATTERN, backend)
            grammar.consume(TOKENS.encode(TOKENS.decode(out)[match.start() :]))
    return out


def generate(engine, prompt, speculation, drafters=None, n=60):
    sampling = SamplingParams(max_tokens=n, constraint=LAZY)
    return engine.generate(prompt_ids=prompt, sampling=sampling, speculation=speculation, drafters=drafters)


def test_the_reference_crosses_the_pattern():
    texts = [TOKENS.decode(reference_greedy(p)) for p in PROMPTS]
    fired = [t for t in texts if re.search(PATTERN, t)]
    assert len(fired) >= 3 and any(TRIGGER in t for t in texts), texts  # else the tests below test nothing
    assert any(not re.search(PATTERN, t) and TRIGGER not in t for t in texts), texts
    for text in fired:
        assert re.fullmatch(r'(?s).*\{"(abc|ab)":[a-c]{1,4}\}', text), text  # the grammar held to the end


def test_plain_decoding_is_the_reference():
    engine = make_engine()
    for prompt in PROMPTS:
        assert generate(engine, prompt, SpeculationConfig(enabled=False)).token_ids == reference_greedy(prompt)


@pytest.mark.parametrize("drafter", ["same", "related", "ngram", "grammar"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_pattern_greedy_equivalence(drafter, k):
    engine = make_engine()
    for prompt in PROMPTS:
        result = generate(engine, prompt, SpeculationConfig(policy="fixed", max_draft_tokens=k), drafters=[drafter])
        assert result.token_ids == reference_greedy(prompt)
        if drafter == "same":
            assert result.stats.acceptance_rate == 1.0  # its drafts cross the pattern and are all kept


def test_a_window_across_the_pattern_is_masked_row_by_row():
    grammar = compile_constraint(LAZY, ToyBackend(BASE))
    draft = TOKENS.encode('x{"ab":')
    rows = grammar.masks(draft)  # after "", x, {, ", a, b, :
    assert [int(r.sum()) for r in rows[:6]] == [VOCAB] * 6  # free: '{"ab' may still go on to 'c' or not
    assert grammar.valid_prefix(TOKENS.encode('x{"ab"x')) == 6  # the match '{"ab"' fires; 'x' is outside
    rows = grammar.masks(TOKENS.encode('{"ab"'))
    assert rows[-1].sum() == 1 and rows[-1][TOKENS.encode(":")[0]]
    assert grammar.valid_prefix(TOKENS.encode('{"ax"{"abc":cc}')) == 15  # a text that is no match stays free
    grammar.consume(TOKENS.encode('zz{"ab'))
    fork = grammar.fork()
    grammar.consume(TOKENS.encode('c"'))  # the match split over two commits still fires
    assert grammar.triggered and grammar.forced(5) == TOKENS.encode(":")
    assert not fork.triggered


class _Joined:
    """The toy tokenizer, but token JOINED reads '"ab":' and REFUSED '"ab"}' (matches that end
    inside a token: the grammar takes the first's rest, not the second's)."""

    JOINED, REFUSED = 88, 89
    TEXTS = {JOINED: '"ab":', REFUSED: '"ab"}'}

    def decode(self, ids):
        return "".join(self.TEXTS.get(i) or TOKENS.decode([i]) for i in ids)

    def encode(self, text, **_):
        return TOKENS.encode(text)


def test_a_match_that_ends_inside_a_token_starts_the_grammar_there():
    backend = ToyBackend(BASE)
    start = compile_constraint(FROM_PATTERN, backend)
    lazy = LazyGrammar([HASH, LT], None, VOCAB, pattern=PatternTrigger(re.compile(PATTERN), start, _Joined()))
    draft = [*TOKENS.encode("x{"), _Joined.JOINED]
    rows = lazy.masks(draft)
    # after '{"ab":' (the token's text past the match's closing quote is read too) only [a-c]
    assert np.flatnonzero(rows[-1]).tolist() == TOKENS.encode("abc")
    lazy.consume(draft)
    assert lazy.triggered
    # a token whose text the grammar refuses after the match does not fire: the text goes on free
    refused = LazyGrammar([HASH, LT], None, VOCAB, pattern=PatternTrigger(re.compile(PATTERN), start, _Joined()))
    assert refused.valid_prefix([*TOKENS.encode("{"), _Joined.REFUSED, *TOKENS.encode('{{"ab"x')]) == 8
    refused.consume([*TOKENS.encode("{"), _Joined.REFUSED, *TOKENS.encode("{")])  # '{"ab"}' is no call
    assert not refused.triggered and refused.masks(TOKENS.encode("x")).all()
    refused.consume(TOKENS.encode('"ab"'))  # a later match fires
    assert refused.triggered


def test_a_pattern_needs_its_grammar():
    with pytest.raises(ConfigError):
        Constraint(CALLS.kind, CALLS.source, TRIGGER, pattern=PATTERN)
    with pytest.raises(ConfigError):
        Constraint("text", "", "", pattern=PATTERN, pattern_source=FROM_PATTERN.source)
    with pytest.raises(ConfigError):
        Constraint.lazy(CALLS, TRIGGER, pattern=PATTERN, from_pattern=Constraint.regex("a"))
    with pytest.raises(ConfigError):
        Constraint.lazy(CALLS, "")  # neither a trigger nor a pattern


# The pattern alone (calls as plain JSON: tools/formats/plain.py): "#<" is plain text then.
PATTERN_ONLY = Constraint.lazy(FROM_PATTERN, "", pattern=PATTERN, from_pattern=FROM_PATTERN)


@pytest.mark.parametrize("drafter", ["same", "ngram", "grammar"])
def test_a_pattern_alone_is_exact_under_speculation(drafter):
    engine = make_engine()
    fired = 0
    for prompt in PROMPTS:
        sampling = SamplingParams(max_tokens=60, constraint=PATTERN_ONLY)
        plain = engine.generate(prompt_ids=prompt, sampling=sampling, speculation=SpeculationConfig(enabled=False))
        spec = SpeculationConfig(policy="fixed", max_draft_tokens=4)
        result = engine.generate(prompt_ids=prompt, sampling=sampling, speculation=spec, drafters=[drafter])
        assert result.token_ids == plain.token_ids
        text = TOKENS.decode(plain.token_ids)
        if re.search(PATTERN, text):
            fired += 1
            assert re.fullmatch(r'(?s).*\{"(abc|ab)":[a-c]{1,4}\}', text), text
    assert fired >= 3
