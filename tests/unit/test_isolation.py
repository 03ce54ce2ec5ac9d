"""One request never harms another: a constraint that fails while decoding, a drafter that
raises and a request cancelled mid-run each end that request alone, beside running requests
whose answers equal their single-request answers and whose slot caches stay intact; a
constraint that admits no answer is refused before it runs (exact toy backend)."""

from dataclasses import replace

import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.batching import Batcher, Done, Failed
from draftwise.constraints import Constraint, ConstraintError, Grammar, compile_constraint
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.base import BaseDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.engine import Engine
from draftwise.types import Draft, SamplingParams, SpeculationConfig

VOCAB = 24
TARGET = ToyModel(vocab_size=VOCAB, order=2, seed=3, sharpness=3.0)
DRAFT = ToyModel(vocab_size=VOCAB, order=2, seed=3, sharpness=2.5)
PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7], [9, 9, 9, 9, 9, 9]]
SPECULATIONS = [SpeculationConfig(policy="fixed", max_draft_tokens=4), SpeculationConfig(), SpeculationConfig()]
DRAFTERS = [["ngram"], ["ngram", "suffix", "draft"], ["draft", "suffix"]]


class Boom(RuntimeError):
    pass


class RaisingDrafter(BaseDrafter):
    """Proposes normally for `after` proposals, then raises (a drafter with a bug)."""

    free = True

    def __init__(self, after: int = 2) -> None:
        self.name, self.after, self.calls = "boom", after, 0

    def for_slot(self, slot: int) -> "RaisingDrafter":
        return RaisingDrafter(self.after)

    def begin(self, sampling, speculation, prompt=(), tokenizer=None) -> None:
        self.calls = 0

    def propose(self, context, max_tokens, grammar=None) -> Draft:
        self.calls += 1
        if self.calls > self.after:
            raise Boom("drafter failed")
        return Draft(tuple(context[-max_tokens:]), source=self.name)

    def accept(self, num_accepted: int) -> None:
        pass


class FailingGrammar(Grammar):
    """A grammar whose masks fail after a few steps (as llguidance's lexer and parser limits do)."""

    def __init__(self, grammar: Grammar, after: int) -> None:
        super().__init__(grammar._matcher, grammar.vocab_size, eos_token_ids=grammar.eos_token_ids)
        self.left = after

    def masks(self, draft_ids):
        self.left -= 1
        if self.left < 0:
            raise ConstraintError("Parser Error: Current row has 2007 items; max is 2000")
        return super().masks(draft_ids)


def make_engine(slots: int) -> Engine:
    drafters = [
        NgramDrafter(1, 3),
        SuffixDrafter(),
        ModelDrafter(ToyBackend(DRAFT, slots=slots, name="draft"), name="draft"),
        RaisingDrafter(),
    ]
    return Engine(ToyBackend(TARGET, slots=slots, name="target"), drafters)


def bystanders(engine: Engine) -> list:
    return [
        engine.stream(prompt_ids=p, sampling=SamplingParams(max_tokens=40, ignore_eos=True), speculation=s, drafters=d)
        for p, s, d in zip(PROMPTS, SPECULATIONS, DRAFTERS)
    ]


def single_answers() -> list[list[int]]:
    out = []
    for gen in bystanders(make_engine(1)):
        for _ in gen:
            pass
        out.append(gen.result.token_ids)
    return out


def run_beside(victim_of, steps_before: int = 0):
    """Run three bystanders and a victim (made by victim_of(engine)) together; returns the
    bystanders, the victim, the events the victim got and the engine."""
    engine = make_engine(4)
    batcher = Batcher(engine, prefill_chunk=4)
    gens = bystanders(engine)
    victim = victim_of(engine)
    for g in [gens[0], victim, *gens[1:]]:
        batcher.add(g)
    events = []
    while batcher.active:
        events += [e for e in batcher.step() if e.generation is victim]
        for a in batcher.active:  # every cache stays what its request committed
            cached = a.slot.target.cached_ids
            assert cached == a.context[: len(cached)]
    return gens, victim, events, engine


def test_a_constraint_failing_mid_decoding_ends_its_request_alone():
    def victim_of(engine):
        gen = engine.stream(
            prompt_ids=[4, 4, 4],
            sampling=SamplingParams(max_tokens=40, constraint=Constraint.regex("[a-z ]{0,60}")),
            speculation=SpeculationConfig(policy="fixed", max_draft_tokens=3),
            drafters=["ngram"],
        )
        gen.request = replace(gen.request, grammar=FailingGrammar(gen.request.grammar, after=3))
        return gen

    gens, victim, events, _ = run_beside(victim_of)
    assert [type(e) for e in events][-1] is Failed
    assert isinstance(events[-1].error, ConstraintError) and "2007 items" in str(events[-1].error)
    assert [g.result.token_ids for g in gens] == single_answers()


def test_a_drafter_that_raises_ends_its_request_alone():
    def victim_of(engine):
        return engine.stream(
            prompt_ids=[7, 7, 7, 7],
            sampling=SamplingParams(max_tokens=40, ignore_eos=True),
            speculation=SpeculationConfig(policy="fixed", max_draft_tokens=3),
            drafters=["boom"],
        )

    gens, victim, events, engine = run_beside(victim_of)
    assert isinstance(events[-1], Failed) and isinstance(events[-1].error, Boom)
    assert [g.result.token_ids for g in gens] == single_answers()
    # The engine serves the next request in the failed request's slot as if nothing happened.
    again = engine.generate(
        prompt_ids=PROMPTS[1],
        sampling=SamplingParams(max_tokens=40, ignore_eos=True),
        speculation=SPECULATIONS[1],
        drafters=DRAFTERS[1],
    )
    assert again.token_ids == single_answers()[1]


def test_a_prompt_that_cannot_be_scored_ends_its_request_alone(monkeypatch):
    """A joining request asking for prompt logprobs (echo) whose scoring fails ends alone; the
    forward it rode in still serves the others."""
    import draftwise.step as step_module

    real = step_module.logprobs

    def failing(rows, tokens, num_top):
        if num_top == 3:  # only the victim asks for 3 alternatives
            raise Boom("prompt scoring failed")
        return real(rows, tokens, num_top)

    monkeypatch.setattr(step_module, "logprobs", failing)

    def victim_of(engine):
        return engine.stream(
            prompt_ids=[2, 4, 6, 8, 10, 12, 14, 16, 18],  # a few prefill chunks of 4
            sampling=SamplingParams(max_tokens=10, ignore_eos=True, prompt_logprobs=3),
        )

    gens, victim, events, _ = run_beside(victim_of)
    assert isinstance(events[-1], Failed) and isinstance(events[-1].error, Boom)
    assert [g.result.token_ids for g in gens] == single_answers()


def test_a_request_cancelled_mid_run_ends_alone():
    flag = {"steps": 0}

    def cancelled():
        flag["steps"] += 1
        return flag["steps"] > 5

    def victim_of(engine):
        return engine.stream(
            prompt_ids=[3, 3],
            sampling=SamplingParams(max_tokens=200, ignore_eos=True),
            drafters=["ngram", "suffix"],
            cancelled=cancelled,
        )

    gens, victim, events, _ = run_beside(victim_of)
    assert isinstance(events[-1], Done) and victim.result.finish_reason == "cancelled"
    assert [g.result.token_ids for g in gens] == single_answers()


def test_a_joint_plan_that_fails_falls_back_to_planning_alone(monkeypatch):
    import draftwise.step as step_module

    def broken(*args, **kwargs):
        raise Boom("joint planning failed")

    monkeypatch.setattr(step_module, "plan_batch", broken)
    gens, victim, events, _ = run_beside(lambda engine: bystanders(engine)[1])
    assert [g.result.token_ids for g in gens] == single_answers()
    assert isinstance(events[-1], Done) and victim.result.token_ids == single_answers()[1]


def test_a_joint_plan_that_fails_is_logged_once(monkeypatch, caplog):
    import draftwise.step as step_module

    def broken(*args, **kwargs):
        raise Boom("joint planning failed")

    monkeypatch.setattr(step_module, "plan_batch", broken)
    monkeypatch.setattr(step_module, "_joint_plan_failures", set())
    with caplog.at_level("WARNING", logger="draftwise.step"):
        run_beside(lambda engine: bystanders(engine)[1])
    warned = [r for r in caplog.records if r.name == "draftwise.step"]
    assert len(warned) == 1 and "joint planning failed" in warned[0].getMessage()


@pytest.mark.parametrize(
    "constraint", [Constraint.regex("[^\\x00-\\U0010FFFF]"), Constraint.grammar("start: /[^\\x00-\\U0010FFFF]/")]
)
def test_a_constraint_that_admits_no_answer_is_refused_before_it_runs(constraint):
    engine = make_engine(1)
    with pytest.raises(ConstraintError, match="no answer|Unsatisfiable|cannot be followed"):
        engine.stream(prompt_ids=[1, 2], sampling=SamplingParams(max_tokens=8, constraint=constraint))
    assert (
        engine.generate(
            prompt_ids=PROMPTS[0],
            sampling=SamplingParams(max_tokens=40, ignore_eos=True),
            speculation=SPECULATIONS[0],
            drafters=DRAFTERS[0],
        ).token_ids
        == single_answers()[0]
    )


def test_a_matcher_error_while_computing_a_mask_raises_instead_of_ending_the_answer():
    grammar = compile_constraint(Constraint.regex("[a-z]{0,10}"), ToyBackend(TARGET))

    class Broken:
        def __init__(self, inner):
            self.inner = inner

        def unsafe_compute_mask_ptr(self, ptr, size):
            self.inner.unsafe_compute_mask_ptr(ptr, size)

        def is_error(self):
            return True

        def get_error(self):
            return "lexer error: too many expressions constructed"

    grammar._matcher = Broken(grammar._matcher)
    with pytest.raises(ConstraintError, match="too many expressions"):
        grammar.allowed()
