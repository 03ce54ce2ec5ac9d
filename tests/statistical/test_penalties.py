"""Penalties and logit bias inside verification stay exact.

Row i of a verified window is penalised given the context and the draft tokens d_1..d_i
before it (sampling.History), in the target's rows and the draft model's alike. Checked:
rows against a per-row reference (deterministic), 3-token continuations sampled with a draft
model and with lookup drafts against the exact joint distribution (chi-square), a negative
control that penalises every row of a window as its first (the "relaxed approximation") and
must be caught, and greedy equivalence with speculation on and off.
"""

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

import draftwise.sampling as sampling_module
from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.engine import Engine
from draftwise.sampling import History, LazyTargetProbs, adjusted, distribution
from draftwise.types import SamplingParams, SpeculationConfig

VOCAB = 5
PROMPT = [1, 2, 1, 2, 1]
LENGTH = 3
NUM_SAMPLES = 8_000  # a 1.5% shift in a 0.2-probability sequence is caught at p < 1e-3

TARGET = ToyModel(vocab_size=VOCAB, order=2, seed=11, sharpness=1.2, eos_bias=0.0)
DRAFT = ToyModel(vocab_size=VOCAB, order=1, seed=5, sharpness=1.0, eos_bias=0.0)

PENALTIES = {
    "presence": dict(presence_penalty=1.2),
    "frequency": dict(frequency_penalty=0.9),
    "repeat": dict(repeat_penalty=1.8, repeat_last_n=4),  # a window shorter than prompt + output
    "logit_bias": dict(logit_bias={3: 1.5, 4: -2.0}),
    "all": dict(
        presence_penalty=-0.5, frequency_penalty=0.7, repeat_penalty=1.3, repeat_last_n=-1, logit_bias={2: 0.8}
    ),
}


# ---------------------------------------------------------------------- rows (deterministic)
def reference_row(logits, params, context, num_prompt):
    """One row adjusted from scratch: bias, llama.cpp's repeat penalty, OpenAI's penalties."""
    row = np.array(logits, dtype=np.float64)
    for token, bias in params.logit_bias:
        row[token] += bias
    if params.repeat_penalty != 1.0 and params.repeat_last_n != 0:
        window = context if params.repeat_last_n < 0 else context[-params.repeat_last_n :]
        for token in set(window):
            row[token] = row[token] / params.repeat_penalty if row[token] > 0 else row[token] * params.repeat_penalty
    for token in set(context[num_prompt:]):
        count = context[num_prompt:].count(token)
        row[token] -= params.frequency_penalty * count + params.presence_penalty
    return row


@pytest.mark.parametrize("name", PENALTIES)
def test_each_row_sees_the_draft_before_it(name):
    params = SamplingParams(temperature=1.0, **PENALTIES[name])
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, VOCAB)) * 2  # [k+1, V]
    context, draft = [1, 2, 1, 2, 1, 3, 3], (4, 3, 3)
    history = History(context, 5, draft)
    got = adjusted(logits, params, history)
    lazy = LazyTargetProbs(logits, params, history)
    for i in range(4):
        expected = reference_row(logits[i], params, context + list(draft[:i]), 5)
        np.testing.assert_allclose(got[i], expected, rtol=0, atol=1e-12)
        np.testing.assert_allclose(
            lazy[i], distribution(expected[None], SamplingParams(temperature=1.0))[0], atol=1e-12
        )


def test_penalty_semantics_by_example():
    logits = np.array([[2.0, -2.0, 1.0, 0.5]])
    rp = SamplingParams(repeat_penalty=2.0, repeat_last_n=2)
    assert adjusted(logits, rp, History([3, 0, 1], 3)).tolist() == [[1.0, -4.0, 1.0, 0.5]]  # token 3 left the window
    # OpenAI's penalties count the output only: the prompt's token 0 is not penalised.
    pf = SamplingParams(presence_penalty=1.0, frequency_penalty=0.5)
    assert adjusted(logits, pf, History([0, 2, 2], 1)).tolist() == [[2.0, -2.0, -1.0, 0.5]]
    assert adjusted(logits, SamplingParams(), None) is logits  # nothing to adjust: no copy, no history needed


# ---------------------------------------------------------------------- sequences (chi-square)
def exact_joint(params: SamplingParams) -> dict[tuple[int, ...], float]:
    joint = {}
    for seq in itertools.product(range(VOCAB), repeat=LENGTH):
        prob, context = 1.0, list(PROMPT)
        for token in seq:
            prob *= distribution(TARGET.logits(context)[None, :], params, History(context, len(PROMPT)))[0, token]
            context.append(token)
        joint[seq] = prob
    return joint


def sample_joint(engine, params, speculation, drafters, num_samples=NUM_SAMPLES):
    counts = {}
    for seed in range(num_samples):
        sp = SamplingParams(**{**params, "seed": seed, "max_tokens": LENGTH, "ignore_eos": True})
        key = tuple(
            engine.generate(prompt_ids=PROMPT, sampling=sp, speculation=speculation, drafters=drafters).token_ids
        )
        counts[key] = counts.get(key, 0) + 1
    return counts


def p_value(counts, joint) -> float:
    assert sum(c for s, c in counts.items() if joint.get(s, 0) == 0) == 0, "sampled a sequence of probability 0"
    cells = sorted(joint, key=joint.get)
    observed = np.array([counts.get(s, 0) for s in cells], dtype=np.float64)
    expected = np.array([joint[s] for s in cells]) * observed.sum()
    small = np.cumsum(expected) < 20  # merge rare cells: expected counts >= 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return float(chisquare(obs[keep], exp[keep]).pvalue)


def engine_with(drafter: str) -> tuple[Engine, SpeculationConfig]:
    if drafter == "draft":
        return (
            Engine(ToyBackend(TARGET), [ModelDrafter(ToyBackend(DRAFT), name="draft")]),
            SpeculationConfig(policy="fixed", max_draft_tokens=2, draft_temperature=0.8),
        )
    return Engine(ToyBackend(TARGET), [NgramDrafter(1, 2)]), SpeculationConfig(policy="fixed", max_draft_tokens=3)


@pytest.mark.slow  # 8,000 sampled answers per case (~15 s)
@pytest.mark.parametrize("drafter", ["draft", "ngram"])
@pytest.mark.parametrize("name", PENALTIES)
def test_joint_distribution_under_penalties(name, drafter):
    params = {"temperature": 1.0, **PENALTIES[name]}
    engine, spec = engine_with(drafter)
    counts = sample_joint(engine, params, spec, [drafter])
    one = engine.generate(
        prompt_ids=PROMPT,
        sampling=SamplingParams(**params, max_tokens=LENGTH, ignore_eos=True),
        speculation=spec,
        drafters=[drafter],
    )
    assert one.stats.num_drafted > 0  # the windows were verified, not decoded one by one
    p = p_value(counts, exact_joint(SamplingParams(**params)))
    assert p > 1e-3, f"p={p:.2e}"


@pytest.mark.slow  # 8,000 sampled answers (~15 s)
def test_detects_rows_penalised_as_the_first(monkeypatch):
    """Negative control: penalising every row of a window by the context before the window only
    (what a relaxed implementation does) must fail the same check."""
    monkeypatch.setattr(sampling_module.History, "at", lambda self, i: self)  # row i sees no d_1..d_i
    params = {"temperature": 1.0, "frequency_penalty": 2.0, "presence_penalty": 1.0}
    engine, spec = engine_with("ngram")
    counts = sample_joint(engine, params, spec, ["ngram"])
    assert p_value(counts, exact_joint(SamplingParams(**params))) < 1e-3


# ---------------------------------------------------------------------- greedy
@pytest.mark.parametrize("name", PENALTIES)
def test_greedy_equals_plain_decoding(name):
    """Temperature 0: the argmax of the penalised rows, identical with and without speculation."""
    target = ToyModel(vocab_size=12, order=2, seed=3, sharpness=2.0, eos_bias=0.0)
    draft = ToyModel(vocab_size=12, order=1, seed=4, sharpness=2.0, eos_bias=0.0)
    params = PENALTIES[name] if name != "logit_bias" else dict(logit_bias={3: 1.5, 4: -2.0, 7: 2.5})
    engine = Engine(ToyBackend(target), [ModelDrafter(ToyBackend(draft), name="draft"), NgramDrafter(1, 3)])
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    sp = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, **params)
    plain = engine.generate(prompt_ids=prompt, sampling=sp, speculation=SpeculationConfig(enabled=False))
    context = list(prompt)
    for token in plain.token_ids:  # each token is the argmax of its penalised row
        row = adjusted(target.logits(context)[None], sp, History(context, len(prompt)))[0]
        assert token == int(np.argmax(row))
        context.append(token)
    for drafter in ("draft", "ngram"):
        spec = SpeculationConfig(policy="fixed", max_draft_tokens=4)
        result = engine.generate(prompt_ids=prompt, sampling=sp, speculation=spec, drafters=[drafter])
        assert result.token_ids == plain.token_ids, drafter
        assert result.stats.num_drafted > 0
