"""Continuous batching on the exact toy backend: every request's greedy output under batching
equals its single-request output (mixed drafters, policies, k, lengths, stop strings,
cancellations, joins and leaves at every step), one target forward per step, no cross-talk."""

import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.batching import Batcher, BatchFull, Done, Emitted
from draftwise.calibrate import CostCurve
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.prediction import PredictionDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.engine import Engine
from draftwise.policy import PlanState
from draftwise.policy.auto import AutoPolicy, plan_batch
from draftwise.policy.cost import TargetTime
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig

VOCAB = 24
TARGET = ToyModel(vocab_size=VOCAB, order=2, seed=3, sharpness=3.0)
DRAFT = ToyModel(vocab_size=VOCAB, order=2, seed=3, sharpness=2.5)  # the same table, flatter


def make_engine(slots: int) -> Engine:
    target = ToyBackend(TARGET, slots=slots, name="target")
    draft = ToyBackend(DRAFT, slots=slots, name="draft")
    drafters = [NgramDrafter(1, 3), SuffixDrafter(), PredictionDrafter(), ModelDrafter(draft, name="draft")]
    return Engine(target, drafters)


PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7], [9, 9, 9, 9, 9, 9], [2, 4, 6, 8, 2, 4, 6], [3], [7, 1, 7, 1, 7]]
REQUESTS = [
    # (prompt, max_tokens, stop, speculation, drafters, prediction)
    (PROMPTS[0], 40, (), SpeculationConfig(policy="fixed", max_draft_tokens=4), ["ngram"], None),
    (PROMPTS[1], 25, (), SpeculationConfig(policy="fixed", max_draft_tokens=3), ["draft"], None),
    (PROMPTS[2], 33, (), SpeculationConfig(policy="heuristic"), ["suffix", "ngram"], None),
    (PROMPTS[3], 50, (), SpeculationConfig(), None, None),
    (PROMPTS[4], 17, (), SpeculationConfig(enabled=False), None, None),
    (PROMPTS[5], 30, (), SpeculationConfig(policy="fixed", max_draft_tokens=6), ["prediction"], "prediction"),
]


def stream(engine, prompt, max_tokens, stop, speculation, drafters, prediction, cancelled=None):
    sampling = SamplingParams(max_tokens=max_tokens, stop=stop, ignore_eos=True)
    if prediction:  # a prediction in token form: the toy's char tokenizer encodes text
        speculation = SpeculationConfig(
            policy=speculation.policy, max_draft_tokens=speculation.max_draft_tokens, prediction=tuple(prompt * 4)
        )
    return engine.stream(
        prompt_ids=prompt, sampling=sampling, speculation=speculation, drafters=drafters, cancelled=cancelled
    )


def single_outputs(requests):
    out = []
    for r in requests:
        engine = make_engine(1)
        out.append(
            engine.generate(
                prompt_ids=r[0],
                sampling=SamplingParams(max_tokens=r[1], stop=r[2], ignore_eos=True),
                speculation=SpeculationConfig(
                    policy=r[3].policy,
                    max_draft_tokens=r[3].max_draft_tokens,
                    enabled=r[3].enabled,
                    prediction=tuple(r[0] * 4) if r[5] else (),
                ),
                drafters=r[4],
            ).token_ids
        )
    return out


def test_batched_greedy_equals_single_request():
    expected = single_outputs(REQUESTS)
    engine = make_engine(4)
    batcher = Batcher(engine, prefill_chunk=3)
    results = batcher.run([stream(engine, *r) for r in REQUESTS])  # 6 requests through 4 slots
    assert [r.token_ids for r in results] == expected
    assert all(r.finish_reason == "length" for r in results)
    assert engine.target.num_batches > 0
    assert batcher.num_free == 4


def test_joins_and_leaves_at_every_step_position():
    expected = single_outputs(REQUESTS[:4])
    for offset in range(0, 6):
        engine = make_engine(3)
        batcher = Batcher(engine, prefill_chunk=2)
        gens = [stream(engine, *r) for r in REQUESTS[:4]]
        batcher.add(gens[0])
        waiting, steps = list(gens[1:]), 0
        while batcher.active or waiting:
            if waiting and batcher.num_free and steps % (offset + 1) == 0:  # joins at varying step positions
                batcher.add(waiting.pop(0))
            batcher.step()
            steps += 1
        assert [g.result.token_ids for g in gens] == expected, offset


def test_stop_strings_and_streamed_text_match_single():
    engine1 = make_engine(1)
    tok = engine1.tokenizer
    single = engine1.generate(
        prompt_ids=PROMPTS[0],
        sampling=SamplingParams(max_tokens=60, ignore_eos=True),
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4),
        drafters=["ngram"],
    )
    stop = single.text[20:23]
    want = make_engine(1).generate(
        prompt_ids=PROMPTS[0],
        sampling=SamplingParams(max_tokens=60, stop=(stop,), ignore_eos=True),
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4),
        drafters=["ngram"],
    )
    engine = make_engine(2)
    batcher = Batcher(engine)
    gens = [
        stream(engine, PROMPTS[0], 60, (stop,), SpeculationConfig(policy="fixed", max_draft_tokens=4), ["ngram"], None),
        stream(engine, PROMPTS[1], 30, (), SpeculationConfig(), None, None),
    ]
    for g in gens:
        batcher.add(g)
    pieces = {id(g): [] for g in gens}
    while batcher.active:
        for event in batcher.step():
            if isinstance(event, Emitted):
                pieces[id(event.generation)].append(event.text)
    assert gens[0].result.text == want.text and gens[0].result.finish_reason == "stop"
    assert "".join(pieces[id(gens[0])]) == want.text
    assert "".join(pieces[id(gens[1])]) == gens[1].result.text == tok.decode(gens[1].result.token_ids)


def test_cancelled_request_leaves_the_others_untouched():
    expected = single_outputs(REQUESTS[:3])
    engine = make_engine(3)
    batcher = Batcher(engine)
    flag = {"stop": False}
    victim = stream(engine, PROMPTS[4], 200, (), SpeculationConfig(), None, None, cancelled=lambda: flag["stop"])
    gens = [stream(engine, *r) for r in REQUESTS[:2]]
    for g in [gens[0], victim, gens[1]]:
        batcher.add(g)
    for _ in range(4):
        batcher.step()
    flag["stop"] = True
    done = [e for e in batcher.step() if isinstance(e, Done)]
    assert any(e.generation is victim for e in done)
    assert victim.result.finish_reason == "cancelled" and 0 < len(victim.result.token_ids) < 200
    third = stream(engine, *REQUESTS[2])
    batcher.add(third)  # into the cancelled request's slot
    while batcher.active:
        batcher.step()
    assert [g.result.token_ids for g in [*gens, third]] == expected


def test_a_superseding_request_takes_the_cancelled_requests_slot_and_cache():
    """reap() ends cancelled requests before new ones are admitted: an editor's next keystroke
    (the same file, one more character) goes to the slot holding the superseded request's cache."""
    engine = make_engine(2)
    batcher = Batcher(engine)
    flag = {"stop": False}
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    old = stream(engine, prompt, 200, (), SpeculationConfig(enabled=False), None, None, cancelled=lambda: flag["stop"])
    assert batcher.add(old) == 0
    batcher.step()
    flag["stop"] = True
    done = [e for e in batcher.reap() if isinstance(e, Done)]
    assert [e.generation for e in done] == [old] and old.result.finish_reason == "cancelled"
    assert batcher.num_free == 2 and batcher.reap() == []
    new = stream(engine, [*prompt, 13], 5, (), SpeculationConfig(enabled=False), None, None)
    assert batcher.add(new) == 0  # the slot whose cache holds the prompt
    while batcher.active:
        batcher.step()
    assert new.result.stats.num_reused_tokens >= len(prompt) - 1  # the cached prompt (its last token with the step)


def test_no_cross_talk_between_sequences():
    engine = make_engine(3)
    batcher = Batcher(engine, prefill_chunk=4)
    gens = [stream(engine, *r) for r in REQUESTS[:3]]
    slots = [batcher.add(g) for g in gens]
    while batcher.active:
        batcher.step()
        for a in batcher.active:  # between steps: committed tokens but the last, nothing else
            cached = a.slot.target.cached_ids
            assert cached == a.context[: len(cached)]
            assert not a.pending and len(cached) == len(a.context) - 1 or a.pending
    for g, s in zip(gens, slots):
        cached = engine.slot(s).target.cached_ids
        full = g.request.prompt_ids + g.result.token_ids
        assert cached == full[: len(cached)], "a slot's cache holds another request's tokens"


def test_one_target_forward_per_step_and_prefix_reuse(monkeypatch):
    import draftwise.step as engine_module

    calls = []
    real = engine_module.extend_batch

    def counting(backend, items):
        calls.append(len(items))
        return real(backend, items)

    monkeypatch.setattr(engine_module, "extend_batch", counting)
    engine = make_engine(2)
    batcher = Batcher(engine, prefill_chunk=100)
    first = stream(engine, *REQUESTS[0])
    batcher.run([first, stream(engine, *REQUESTS[1])])
    assert len(calls) == batcher.num_steps and max(calls) == 2  # one forward per step, both requests in it
    assert engine.target.num_batches == sum(1 for n in calls if n > 1)
    # A follow-up with the first answer as its prompt goes to the first request's slot.
    follow = stream(
        engine, first.request.prompt_ids + first.result.token_ids + [4], 5, (), SpeculationConfig(), None, None
    )
    slot = batcher.add(follow)
    assert follow.request is not None and slot == 0
    while batcher.active:
        batcher.step()
    assert follow.result.stats.num_reused_tokens == len(first.request.prompt_ids) + len(first.result.token_ids) - 1


def test_full_batch_is_refused_and_slot_errors_are_clear():
    engine = make_engine(1)
    batcher = Batcher(engine)
    batcher.add(stream(engine, *REQUESTS[0]))
    with pytest.raises(BatchFull):
        batcher.add(stream(engine, *REQUESTS[1]))
    with pytest.raises(ConfigError, match="1 slot"):
        engine.slot(1)


def test_batch_policy_drafts_less_as_the_batch_grows():
    # Verifying costs 10 ms + 4 ms per row: one request drafts a long, sure n-gram match;
    # in a batch of 12 the same draft competes with 11 plain rows at the margin.
    curve = CostCurve.linear(10.0, 4.0, max_n=400)
    time_model = TargetTime(curve=curve)
    context = [1, 2, 3, 4, 5, 6, 7, 8] * 4

    def policies(n):
        out = []
        for _ in range(n):
            p = AutoPolicy(target_cost=curve, time=time_model, calibrate=False)
            p.begin([NgramDrafter(1, 4)], SpeculationConfig())
            out.append(p)
        return out

    alone = plan_batch(policies(1), [PlanState(context=context, max_k=32)])[0]
    crowd = plan_batch(policies(12), [PlanState(context=context, max_k=32)] * 12)
    assert alone.k > 0
    assert sum(p.k for p in crowd) / len(crowd) < alone.k
    single = policies(1)[0].plan(PlanState(context=context, max_k=32))
    assert single.k == alone.k  # one request: today's rule


class _GuardedSet(set):
    """A busy set that records each change made without its lock held."""

    def __init__(self, lock):
        super().__init__()
        self.lock, self.unguarded = lock, []

    def add(self, index):
        if not self.lock._is_owned():
            self.unguarded.append(("add", index))
        super().add(index)

    def discard(self, index):
        if not self.lock._is_owned():
            self.unguarded.append(("discard", index))
        super().discard(index)


def test_busy_slots_change_only_under_the_pool_lock():
    engine = make_engine(3)
    engine.pool.busy = guarded = _GuardedSet(engine.lock)
    batcher = Batcher(engine, prefill_chunk=2)
    for r in REQUESTS[:3]:
        batcher.add(stream(engine, *r))
    assert engine.busy_slots == {0, 1, 2}
    batcher.step()
    batcher.fail([batcher.active[0]], RuntimeError("boom"))  # _release through fail
    batcher.abandon()  # the caller stopped listening: the rest released
    finished = make_engine(1)
    finished.pool.busy = guarded_done = _GuardedSet(finished.lock)
    Batcher(finished).run([stream(finished, *REQUESTS[4])])  # _release through _finish
    assert engine.busy_slots == set() and finished.busy_slots == set()
    assert guarded.unguarded == [] and guarded_done.unguarded == []
    assert engine.pool is batcher.pool  # the Engine and its Batchers share one pool


def test_a_slot_another_batcher_claimed_is_not_chosen():
    engine = make_engine(2)
    first, second = Batcher(engine), Batcher(engine)  # both made while every slot is free
    taken = first.add(stream(engine, *REQUESTS[0]))
    other = second.add(stream(engine, *REQUESTS[1]))
    assert {taken, other} == {0, 1} and engine.busy_slots == {0, 1}
    with pytest.raises(BatchFull):
        second.add(stream(engine, *REQUESTS[2]))


def test_a_long_prompt_cancelled_mid_prefill_ends_within_one_more_chunk(monkeypatch):
    """A 20,000-token prompt read in PREFILL_CHUNK-row chunks beside a decoding request: a cancellation
    that arrives while a chunk is being read ends the request before the next chunk (rows counted, not
    time), frees its slot, leaves the neighbour's answer untouched, and the next request, which reuses the
    part of the prompt that was read, answers as a fresh engine does."""
    import draftwise.step as step_module
    from draftwise.batching import PREFILL_CHUNK

    n_ctx = 32_768

    def toy_engine(slots: int) -> Engine:
        return Engine(ToyBackend(TARGET, slots=slots, n_ctx=n_ctx, name="target"), [NgramDrafter(1, 3)])

    long_prompt = [(i * 7 + i // 11) % VOCAB for i in range(20_000)]
    engine = toy_engine(2)
    batcher = Batcher(engine)  # the server's: PREFILL_CHUNK prompt rows a step when there are several slots
    assert batcher.prefill_chunk == PREFILL_CHUNK
    flag = {"stop": False}
    neighbour = stream(engine, *REQUESTS[0])
    victim = engine.stream(
        prompt_ids=long_prompt,
        sampling=SamplingParams(max_tokens=20, ignore_eos=True),
        speculation=SpeculationConfig(enabled=False),
        cancelled=lambda: flag["stop"],
    )
    batcher.add(neighbour)
    victim_seq = engine.slot(batcher.add(victim)).target
    rows = {"before": 0, "after": 0}  # the victim's prompt rows read before and after the cancellation
    real = step_module.extend_batch

    def counting(backend, items):
        for seq, ids, _ in items:
            if seq is victim_seq and victim.result is None:
                if rows["before"] >= 3 * PREFILL_CHUNK:
                    flag["stop"] = True  # the client goes away while this chunk is being read
                rows["after" if flag["stop"] else "before"] += len(ids)
        return real(backend, items)

    monkeypatch.setattr(step_module, "extend_batch", counting)
    steps_after = 0
    while victim.result is None:
        batcher.step()
        steps_after += flag["stop"]
        assert steps_after <= 2, "the cancelled request outlived the next step"
    assert victim.result.finish_reason == "cancelled" and victim.result.token_ids == []
    assert 0 < rows["after"] <= PREFILL_CHUNK  # the chunk in flight, nothing more
    assert len(victim_seq.cached_ids) == rows["before"] + rows["after"] < len(long_prompt)
    assert batcher.num_free == 1  # the victim's slot; the neighbour still runs
    while batcher.active:
        batcher.step()
    assert neighbour.result.token_ids == single_outputs(REQUESTS[:1])[0]
    assert batcher.num_free == 2 and engine.busy_slots == set()

    # The next request shares the prompt's start: it takes the cancelled request's slot and the rows read.
    prompt = long_prompt[:3000] + [1, 2, 3]
    sampling = SamplingParams(max_tokens=24, ignore_eos=True)
    spec = SpeculationConfig(policy="fixed", max_draft_tokens=4)
    following = engine.stream(prompt_ids=prompt, sampling=sampling, speculation=spec)
    assert engine.slot(batcher.add(following)).target is victim_seq
    while batcher.active:
        batcher.step()
    fresh = toy_engine(1).generate(prompt_ids=prompt, sampling=sampling, speculation=spec)
    assert following.result.token_ids == fresh.token_ids and len(fresh.token_ids) == 24
    assert following.result.stats.num_reused_tokens == rows["before"] + rows["after"]


def test_a_single_request_sees_a_cancellation_within_one_chunk_of_its_prompt(monkeypatch):
    """engine.generate/stream (a Batcher of one slot, the server's path with one slot) reads a long
    prompt in SOLO_PREFILL_CHUNK-row chunks: a request cancelled while its first chunk is read ends
    before the next one (rows counted, not time), and the next request reuses what was read and
    answers as a fresh engine does."""
    import draftwise.step as step_module
    from draftwise.batching import SOLO_PREFILL_CHUNK

    def toy_engine() -> Engine:
        return Engine(ToyBackend(TARGET, n_ctx=32_768, name="target"), [NgramDrafter(1, 3)])

    engine = toy_engine()
    long_prompt = [(i * 7 + i // 11) % VOCAB for i in range(20_000)]
    flag = {"stop": False}
    real, rows = step_module.extend_batch, []

    def counting(backend, items):
        flag["stop"] = True  # the client goes away as the first forward starts
        rows.extend(len(ids) for _, ids, _ in items)
        return real(backend, items)

    monkeypatch.setattr(step_module, "extend_batch", counting)
    result = engine.generate(
        prompt_ids=long_prompt,
        sampling=SamplingParams(max_tokens=20, ignore_eos=True),
        speculation=SpeculationConfig(enabled=False),
        cancelled=lambda: flag["stop"],
    )
    assert result.finish_reason == "cancelled" and result.token_ids == []
    assert rows == [SOLO_PREFILL_CHUNK]  # one chunk, not the 19,999 rows of the whole prompt
    monkeypatch.setattr(step_module, "extend_batch", real)
    prompt = long_prompt[:3000] + [1, 2, 3]
    sampling = SamplingParams(max_tokens=24, ignore_eos=True)
    spec = SpeculationConfig(policy="fixed", max_draft_tokens=4)
    following = engine.generate(prompt_ids=prompt, sampling=sampling, speculation=spec)
    assert following.stats.num_reused_tokens == SOLO_PREFILL_CHUNK
    assert (
        following.token_ids == toy_engine().generate(prompt_ids=prompt, sampling=sampling, speculation=spec).token_ids
    )
