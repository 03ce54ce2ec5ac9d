"""Engine behaviour on the toy backend: stops, streaming, cancellation, errors, reuse."""

import numpy as np
import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.engine import Engine, PromptTooLongError
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig

MODEL = ToyModel(vocab_size=40, order=2, seed=7, sharpness=3.0)
SPEC = SpeculationConfig(policy="fixed", max_draft_tokens=4)


def make_engine(n_ctx=4096):
    return Engine(
        ToyBackend(MODEL, n_ctx=n_ctx),
        [ModelDrafter(ToyBackend(ToyModel(vocab_size=40, order=1, seed=7)), name="draft")],
    )


def test_stream_pieces_join_to_text():
    engine = make_engine()
    gen = engine.stream("hello", sampling=SamplingParams(max_tokens=50, ignore_eos=True), speculation=SPEC)
    pieces = list(gen)
    assert "".join(pieces) == gen.result.text and len(pieces) > 1
    assert gen.result.stats.num_generated == 50 == len(gen.result.token_ids)
    assert gen.result.finish_reason == "length"


def test_stop_string_cuts_text_and_never_streams_it():
    engine = make_engine()
    full = engine.generate("hello", sampling=SamplingParams(max_tokens=60, ignore_eos=True), speculation=SPEC).text
    stop = full[20:23]
    gen = engine.stream(
        "hello", sampling=SamplingParams(max_tokens=60, ignore_eos=True, stop=(stop,)), speculation=SPEC
    )
    streamed = "".join(gen)
    assert streamed == gen.result.text == full[: full.index(stop)]
    assert gen.result.finish_reason == "stop"


def eos_after(n):
    def logits(context):
        row = np.zeros(5)
        row[0 if len(context) >= n else 1 + len(context) % 4] = 5.0
        return row

    return logits


def test_eos_stops_and_is_not_in_output():
    engine = Engine(ToyBackend(logits_fn=eos_after(8), vocab_size=5), [NgramDrafter(1, 2)])
    result = engine.generate(prompt_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=50), speculation=SPEC)
    assert result.finish_reason == "stop"
    assert len(result.token_ids) == 5 and 0 not in result.token_ids


def test_cancellation_stops_between_steps_and_next_request_is_clean():
    engine = make_engine()
    reference = engine.generate("abc", sampling=SamplingParams(max_tokens=30), speculation=SPEC)
    calls = []
    gen = engine.stream(
        "xyz",
        sampling=SamplingParams(max_tokens=30),
        speculation=SPEC,
        cancelled=lambda: calls.append(1) or len(calls) > 2,
    )
    list(gen)
    assert gen.result.finish_reason == "cancelled"
    again = engine.generate("abc", sampling=SamplingParams(max_tokens=30), speculation=SPEC)
    assert again.token_ids == reference.token_ids


def test_abandoned_stream_leaves_engine_usable():
    engine = make_engine()
    reference = engine.generate("abc", sampling=SamplingParams(max_tokens=30), speculation=SPEC)
    gen = engine.stream("qqq", sampling=SamplingParams(max_tokens=30), speculation=SPEC)
    next(gen)
    gen.close()
    assert (
        engine.generate("abc", sampling=SamplingParams(max_tokens=30), speculation=SPEC).token_ids
        == reference.token_ids
    )


def test_failure_mid_request_resets_and_recovers():
    calls = {"n": 0}

    def flaky(context):
        calls["n"] += 1
        if calls["n"] == 15:
            raise RuntimeError("boom")
        return MODEL.logits(context)

    engine = Engine(ToyBackend(logits_fn=flaky, vocab_size=40))
    with pytest.raises(RuntimeError):
        engine.generate("abc", sampling=SamplingParams(max_tokens=30))
    assert engine.target.num_cached == 0
    assert len(engine.generate("abc", sampling=SamplingParams(max_tokens=30)).token_ids) > 0


def test_prompt_too_long_and_empty_prompt():
    engine = make_engine(n_ctx=16)
    with pytest.raises(PromptTooLongError, match="16"):
        engine.generate(prompt_ids=list(range(1, 20)))
    with pytest.raises(ConfigError):
        engine.generate(prompt_ids=[])


def test_context_window_ends_generation_with_length():
    engine = make_engine(n_ctx=32)
    result = engine.generate(
        prompt_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=100, ignore_eos=True), speculation=SPEC
    )
    assert result.finish_reason == "length"
    assert len(result.token_ids) + 3 <= 33


def test_prefix_reuse_between_requests():
    engine = make_engine()
    engine.generate(prompt_ids=list(range(1, 30)), sampling=SamplingParams(max_tokens=5))
    second = engine.generate(prompt_ids=list(range(1, 30)) + [5, 6], sampling=SamplingParams(max_tokens=5))
    assert second.stats.num_reused_tokens == 29


def test_unknown_drafter_name_is_an_error():
    with pytest.raises(ConfigError, match="unknown drafter"):
        make_engine().stream("a", drafters=["nope"])


def test_metrics_definitions():
    engine = Engine(ToyBackend(MODEL), [ModelDrafter(ToyBackend(MODEL), name="draft")])
    s = engine.generate(
        prompt_ids=[1, 2], sampling=SamplingParams(max_tokens=20, ignore_eos=True), speculation=SPEC
    ).stats
    assert s.num_drafted == s.num_accepted  # same model: everything accepted
    assert s.tokens_per_step == s.num_generated / s.num_steps
    assert s.mean_accepted_tokens == s.num_accepted / s.num_steps_with_draft
    d = s.to_dict()
    for key in (
        "num_drafted",
        "num_accepted",
        "num_steps",
        "acceptance_rate",
        "mean_accepted_tokens",
        "tokens_per_step",
        "accepted_per_position",
        "tokens_per_second",
    ):
        assert key in d
