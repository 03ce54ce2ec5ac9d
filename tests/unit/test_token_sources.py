"""Token sources: asked for, every piece of an answer's text carries the token that wrote it and
where that token came from (the target's own, a drafter's accepted draft token, the grammar's
forced token), and its step's drafted / accepted counts. The spans cover the text exactly (the
streamed pieces and the final text, stop strings and half characters included), agree with the
step statistics, and never change what is generated.
"""

from collections import Counter

import pytest

from draftwise.backends.toy import CharTokenizer, ToyBackend, ToyModel
from draftwise.batching import Batcher, Emitted
from draftwise.constraints import Constraint
from draftwise.drafters import NgramDrafter
from draftwise.drafters.prediction import PredictionDrafter
from draftwise.engine import Engine
from draftwise.types import SamplingParams, SpeculationConfig

TARGET = ToyModel(vocab_size=40, order=2, seed=5, sharpness=3.0)
PROMPT = [3, 4, 5, 6] * 6


def plain_ids(max_tokens: int, **sampling) -> list[int]:
    engine = Engine(ToyBackend(TARGET))
    result = engine.generate(
        prompt_ids=PROMPT,
        sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling),
        speculation=SpeculationConfig(enabled=False),
    )
    return result.token_ids


def streamed(engine: Engine, **kwargs):
    """Run one request through a Batcher; returns its Emitted events and the Result."""
    gen = engine.stream(prompt_ids=PROMPT, token_sources=True, **kwargs)
    batcher = Batcher(engine, slots=[0])
    batcher.add(gen)
    events = []
    while batcher.active:
        events += [e for e in batcher.step() if isinstance(e, Emitted)]
    return events, gen.result


def check_cover(events, result) -> None:
    """The streamed spans are the streamed text, and the final spans the final text."""
    assert "".join(e.text for e in events) == result.text
    for e in events:
        assert "".join(s.text for s in e.spans) == e.text
    assert "".join(s.text for s in result.spans) == result.text
    assert [s for e in events for s in e.spans] == result.spans


def test_a_copied_prediction_is_attributed_to_the_prediction_drafter():
    expected = plain_ids(60)
    engine = Engine(ToyBackend(TARGET), [PredictionDrafter()])
    speculation = SpeculationConfig(policy="fixed", max_draft_tokens=4, prediction=tuple(expected))
    events, result = streamed(engine, sampling=SamplingParams(max_tokens=60, ignore_eos=True), speculation=speculation)
    assert result.token_ids == expected  # sources never change the answer
    check_cover(events, result)
    sources = Counter(s.source for s in result.spans)
    assert set(sources) == {"prediction", "target"}
    # A perfect prediction: each step accepts all it drafted, then the target adds one token.
    stats = result.stats
    assert stats.tokens_by_source == Counter({"prediction": stats.num_accepted, "target": stats.num_steps})
    assert sum(stats.tokens_by_source.values()) == stats.num_generated == 60
    for span in result.spans:
        assert 1 <= span.step <= stats.num_steps
        assert span.accepted == span.drafted == 4 or span.step == stats.num_steps
        assert span.logprob is None  # none asked
    per_step = Counter(s.step for s in result.spans if s.source == "prediction")
    assert all(n <= 4 for n in per_step.values())


def test_plain_decoding_is_all_the_targets():
    engine = Engine(ToyBackend(TARGET), [NgramDrafter(1, 3)])
    events, result = streamed(
        engine, sampling=SamplingParams(max_tokens=30, ignore_eos=True), speculation=SpeculationConfig(enabled=False)
    )
    check_cover(events, result)
    assert {s.source for s in result.spans} == {"target"}
    assert [s.step for s in result.spans] == list(range(1, 31))
    assert all(s.drafted == s.accepted == 0 for s in result.spans)
    assert result.stats.tokens_by_source == Counter({"target": 30})


def test_rejected_drafts_leave_the_target_token_and_counts_agree_with_the_steps():
    engine = Engine(ToyBackend(TARGET), [NgramDrafter(1, 3)])
    sampling = SamplingParams(max_tokens=80, temperature=0.8, seed=3, ignore_eos=True, logprobs=0)
    events, result = streamed(
        engine, sampling=sampling, speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4)
    )
    check_cover(events, result)
    stats = result.stats
    by_step: dict[int, list] = {}
    for span in result.spans:
        by_step.setdefault(span.step, []).append(span)
        assert span.logprob is not None and span.logprob <= 0.0
    for spans in by_step.values():
        drafted, accepted = spans[0].drafted, spans[0].accepted
        assert all((s.drafted, s.accepted) == (drafted, accepted) for s in spans)
        assert sum(s.source == "ngram" for s in spans) == accepted  # no cut inside a step here
        assert sum(s.source == "target" for s in spans) <= 1
    assert sum(stats.tokens_by_source.values()) == stats.num_generated


def test_forced_tokens_are_the_grammars():
    engine = Engine(ToyBackend(TARGET), [NgramDrafter(1, 3)])
    constraint = Constraint.regex("[a-c]abcdefg[a-c]")
    events, result = streamed(
        engine,
        sampling=SamplingParams(max_tokens=20, constraint=constraint),
        speculation=SpeculationConfig(policy="fixed"),
    )
    check_cover(events, result)
    assert "".join(s.text for s in result.spans if s.source == "grammar") == "abcdefg"
    # The forced tokens of the text (num_forced_tokens also counts the forced EOS, which is not text).
    assert result.stats.tokens_by_source["grammar"] == 7


def test_a_stop_string_cuts_the_spans_with_the_text():
    engine = Engine(ToyBackend(TARGET), [NgramDrafter(1, 3)])
    text = engine.tokenizer.decode(plain_ids(60))
    stop = text[20:23]
    events, result = streamed(
        engine,
        sampling=SamplingParams(max_tokens=60, ignore_eos=True, stop=(stop,)),
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4),
    )
    assert result.text == text[: text.index(stop)]
    check_cover(events, result)


class ByteTokenizer(CharTokenizer):
    """Pieces are bytes, two of them the halves of "é": a token may end mid-character."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__(vocab_size)
        self._bytes = [b"", *(p.encode() for p in self._pieces[1:-2]), b"\xc3", b"\xa9"]

    def decode(self, ids) -> str:
        return b"".join(self._bytes[i] for i in ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("speculation", [SpeculationConfig(enabled=False), SpeculationConfig(policy="fixed")])
def test_half_characters_go_to_the_token_that_completes_them(speculation):
    engine = Engine(ToyBackend(TARGET, tokenizer=ByteTokenizer(40)), [NgramDrafter(1, 3)])
    events, result = streamed(
        engine,
        sampling=SamplingParams(max_tokens=120, temperature=1.0, seed=7, ignore_eos=True),
        speculation=speculation,
    )
    check_cover(events, result)
    assert len(result.spans) <= len(result.token_ids)


def test_without_asking_there_are_no_spans_but_the_counts_are_kept():
    engine = Engine(ToyBackend(TARGET), [NgramDrafter(1, 3)])
    gen = engine.stream(prompt_ids=PROMPT, sampling=SamplingParams(max_tokens=20, ignore_eos=True))
    batcher = Batcher(engine, slots=[0])
    batcher.add(gen)
    events = []
    while batcher.active:
        events += [e for e in batcher.step() if isinstance(e, Emitted)]
    assert all(e.spans == () for e in events)
    assert gen.result.spans is None
    assert sum(gen.result.stats.tokens_by_source.values()) == 20


def test_a_streamed_generation_keeps_the_spans_of_its_text_so_far():
    expected = plain_ids(40)
    engine = Engine(ToyBackend(TARGET), [PredictionDrafter()])
    gen = engine.stream(
        prompt_ids=PROMPT,
        sampling=SamplingParams(max_tokens=40, ignore_eos=True),
        speculation=SpeculationConfig(policy="fixed", prediction=tuple(expected)),
        token_sources=True,
    )
    text = ""
    for piece in gen:
        text += piece
        assert "".join(s.text for s in gen.spans) == text
    assert gen.spans == gen.result.spans
    assert any(s.source == "prediction" for s in gen.spans)
