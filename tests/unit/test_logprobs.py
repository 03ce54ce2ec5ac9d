"""Logprobs are the target's raw log-softmax at each token's own position, whatever decided the
token (plain step, accepted draft, recovered or bonus token, grammar-forced token), so
speculative decoding reports what plain decoding reports. Checked on the exact toy backend
against log_softmax(model.logits(context)); prompt logprobs (echo) the same way.
"""

import numpy as np
import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.batching import Batcher, Emitted
from draftwise.constraints import Constraint
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.engine import Engine
from draftwise.sampling import logprobs
from draftwise.types import SamplingParams, SpeculationConfig

TARGET = ToyModel(vocab_size=12, order=2, seed=3, sharpness=1.5, eos_bias=-2.0)
DRAFT = ToyModel(vocab_size=12, order=1, seed=4, sharpness=1.5, eos_bias=-2.0)
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]
SPECS = {
    "plain": (SpeculationConfig(enabled=False), None),
    "draft": (SpeculationConfig(policy="fixed", max_draft_tokens=3), ["draft"]),
    "ngram": (SpeculationConfig(policy="fixed", max_draft_tokens=4), ["ngram"]),
    "grammar": (SpeculationConfig(policy="fixed", max_draft_tokens=4), ["grammar"]),
}


def engine() -> Engine:
    return Engine(
        ToyBackend(TARGET), [ModelDrafter(ToyBackend(DRAFT), name="draft"), NgramDrafter(1, 3), GrammarDrafter()]
    )


def reference(model, context, tokens, num_top):
    """Each token's raw log-softmax entry at its position, from the model's own table."""
    out, context = [], list(context)
    for token in tokens:
        row = model.logits(context)
        out.append(logprobs(row[None], [token], num_top)[0])
        context.append(token)
    return out


def assert_close(got, expected):
    assert [g.token for g in got] == [e.token for e in expected]
    np.testing.assert_allclose([g.logprob for g in got], [e.logprob for e in expected], atol=1e-9)
    for g, e in zip(got, expected):
        assert [t for t, _ in g.top] == [t for t, _ in e.top]
        np.testing.assert_allclose([lp for _, lp in g.top], [lp for _, lp in e.top], atol=1e-9)


def test_logprobs_by_example():
    (entry,) = logprobs(np.array([[0.0, 0.0, np.log(2.0)]]), [1], 2)
    assert entry.token == 1 and entry.logprob == pytest.approx(np.log(0.25))
    assert [t for t, _ in entry.top] == [2, 0]  # ties: the lower id first
    assert [lp for _, lp in entry.top] == pytest.approx([np.log(0.5), np.log(0.25)])


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_token_reports_its_own_row(name, temperature):
    spec, drafters = SPECS[name]
    sp = SamplingParams(
        temperature=temperature, seed=7, max_tokens=40, ignore_eos=True, logprobs=3, frequency_penalty=0.3
    )  # the penalty changes sampling, never the reported row
    result = engine().generate(prompt_ids=PROMPT, sampling=sp, speculation=spec, drafters=drafters)
    assert len(result.logprobs) == len(result.token_ids) == 40
    assert_close(result.logprobs, reference(TARGET, PROMPT, result.token_ids, 3))
    if name in ("draft", "ngram"):
        assert result.stats.num_accepted > 0


def test_greedy_speculative_logprobs_equal_plain():
    results = {
        name: engine().generate(
            prompt_ids=PROMPT, sampling=SamplingParams(max_tokens=30, logprobs=5), speculation=spec, drafters=drafters
        )
        for name, (spec, drafters) in SPECS.items()
    }
    for name, result in results.items():
        assert result.token_ids == results["plain"].token_ids, name
        assert_close(result.logprobs, results["plain"].logprobs)


@pytest.mark.parametrize("name", SPECS)
def test_grammar_forced_tokens_get_their_rows(name):
    """'c' after a letter and the closing "k" are forced; speculation commits them with no
    decision, yet each reports the model's own logprob there (not 0)."""
    spec, drafters = SPECS[name]
    sp = SamplingParams(
        temperature=1.0, seed=3, max_tokens=20, logprobs=2, constraint=Constraint.regex("[ab]cc[a-d]{2}k")
    )
    result = engine().generate(prompt_ids=PROMPT, sampling=sp, speculation=spec, drafters=drafters)
    assert len(result.token_ids) == 6 and result.finish_reason == "stop"
    assert_close(result.logprobs, reference(TARGET, PROMPT, result.token_ids, 2))
    if name != "plain":
        assert result.stats.num_forced_tokens > 0


def test_prompt_logprobs_with_no_new_tokens():
    """echo with max_tokens 0 (lm-eval's loglikelihood): every prompt token after the first is
    scored from the row before it; the cache a previous request left is read again."""
    eng = engine()
    eng.generate(prompt_ids=PROMPT, sampling=SamplingParams(max_tokens=4))  # leaves PROMPT cached
    sp = SamplingParams(max_tokens=0, prompt_logprobs=1)
    result = eng.generate(prompt_ids=PROMPT, sampling=sp)
    assert result.token_ids == [] and result.finish_reason == "length"
    assert_close(result.prompt_logprobs, reference(TARGET, PROMPT[:1], PROMPT[1:], 1))


def test_prompt_logprobs_in_chunks_beside_other_requests():
    eng = Engine(ToyBackend(TARGET, slots=2), [])
    batcher = Batcher(eng, prefill_chunk=3)
    long_prompt = (PROMPT * 3)[:20]
    results = batcher.run(
        [
            eng.stream(prompt_ids=PROMPT, sampling=SamplingParams(max_tokens=10)),
            eng.stream(prompt_ids=long_prompt, sampling=SamplingParams(max_tokens=2, prompt_logprobs=0, logprobs=0)),
        ]
    )
    assert_close(results[1].prompt_logprobs, reference(TARGET, long_prompt[:1], long_prompt[1:], 0))
    assert_close(results[1].logprobs, reference(TARGET, long_prompt, results[1].token_ids, 0))


def text_tokens(tokenizer, token_ids, text):
    """How many tokens the text shows: the first n whose decoding reaches its end."""
    return next(n for n in range(len(token_ids) + 1) if len(tokenizer.decode(token_ids[:n])) >= len(text))


def test_stream_pieces_carry_their_tokens_logprobs_and_a_stop_string_cuts_them():
    eng = engine()
    plain = SpeculationConfig(enabled=False)
    sp = SamplingParams(temperature=1.0, seed=1, max_tokens=30, ignore_eos=True, logprobs=1)
    full = eng.generate(prompt_ids=PROMPT, sampling=sp, speculation=plain)
    text = eng.tokenizer.decode(full.token_ids)
    stop = text[10:12]
    stopped = SamplingParams(**{**sp.__dict__, "stop": (stop,)})
    cut = eng.generate(prompt_ids=PROMPT, sampling=stopped, speculation=plain)
    assert cut.text == text[: text.index(stop)]
    assert [e.token for e in cut.logprobs] == full.token_ids[: text_tokens(eng.tokenizer, full.token_ids, cut.text)]
    batcher = Batcher(eng, slots=[0])
    spec = SpeculationConfig(policy="fixed", max_draft_tokens=3)
    gen = eng.stream(prompt_ids=PROMPT, sampling=stopped, speculation=spec, drafters=["ngram"])
    batcher.add(gen)
    pieces = []
    while batcher.active:
        pieces += [e for e in batcher.step() if isinstance(e, Emitted)]
    result = gen.result
    assert "".join(e.text for e in pieces) == result.text
    assert [lp for e in pieces for lp in e.logprobs] == result.logprobs
    n = text_tokens(eng.tokenizer, result.token_ids, result.text)
    assert_close(result.logprobs, reference(TARGET, PROMPT, result.token_ids[:n], 1))
