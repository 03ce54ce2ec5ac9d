"""llama.cpp backend on tiny random GGUF models the test writes itself (seconds)."""

import numpy as np
import pytest

from draftwise.backends.base import BackendError, ContextOverflowError
from draftwise.backends.llamacpp import LlamaCppBackend
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.engine import Engine, TokenizerMismatchError
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"


@pytest.fixture(scope="module")
def target(tiny_gguf_dir):
    backend = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=512, n_threads=1)
    yield backend
    backend.close()


def test_rollback_property(target):
    """extend -> truncate -> extend gives the same logits' argmax as a fresh run."""
    ids = target.tokenizer.encode(PROMPT)
    target.reset()
    target.prefill(ids[:10])
    first = target.extend(ids[10:20])  # [10, V]
    target.truncate(12)
    assert target.num_cached == 12 and target.cached_ids == ids[:12]
    again = target.extend(ids[12:20])
    np.testing.assert_array_equal(again.argmax(-1), first[2:].argmax(-1))
    target.reset()
    fresh = target.extend(ids[:20])
    np.testing.assert_array_equal(fresh[10:].argmax(-1), first.argmax(-1))
    np.testing.assert_allclose(fresh[10:], first, atol=5e-3)


def test_batched_matches_one_at_a_time(target):
    ids = target.tokenizer.encode(PROMPT)[:16]
    target.reset()
    batched = target.extend(ids)
    target.reset()
    single = np.concatenate([target.extend([t]) for t in ids])
    np.testing.assert_array_equal(batched.argmax(-1), single.argmax(-1))


def test_truncate_out_of_range_raises(target):
    target.reset()
    target.prefill([1, 2, 3])
    with pytest.raises(BackendError):
        target.truncate(5)
    with pytest.raises(ContextOverflowError):
        target.prefill(list(range(100)) * 6)
    assert target.cached_ids == [1, 2, 3]  # a failed call leaves the cache as it was


def test_bad_token_id_raises_and_keeps_state(target):
    target.reset()
    target.prefill([1, 2])
    with pytest.raises(BackendError):
        target.extend([5, 10_000])
    assert target.cached_ids == [1, 2]


@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize("drafter", ["draft", "twin", "ngram"])
def test_greedy_equivalence_tiny(tiny_gguf_dir, target, drafter, k):
    drafters = [NgramDrafter(1, 3)]
    if drafter != "ngram":
        drafters = [
            ModelDrafter(LlamaCppBackend(tiny_gguf_dir / f"{drafter}.gguf", n_ctx=512, n_threads=1), name=drafter)
        ]
    engine = Engine(target, drafters)
    sampling = SamplingParams(max_tokens=40, ignore_eos=True)
    plain = engine.generate(PROMPT, sampling=sampling, speculation=SpeculationConfig(enabled=False))
    spec = engine.generate(PROMPT, sampling=sampling, speculation=SpeculationConfig(policy="fixed", max_draft_tokens=k))
    assert spec.token_ids == plain.token_ids
    assert spec.stats.num_drafted > 0
    if drafter == "twin":
        assert spec.stats.acceptance_rate > 0.9


def test_chat_template_and_prefix_reuse(target):
    engine = Engine(target)
    messages = [{"role": "user", "content": "hi there"}]
    first = engine.generate(messages=messages, sampling=SamplingParams(max_tokens=5))
    second = engine.generate(messages=messages, sampling=SamplingParams(max_tokens=5))
    assert second.token_ids == first.token_ids
    assert second.stats.num_reused_tokens == second.stats.num_prompt_tokens - 1


def test_a_context_beyond_the_trained_window_is_refused(tmp_path):
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "short.gguf", context_length=256)
    with pytest.raises(ConfigError, match="beyond short.gguf's trained context window of 256 tokens; use --n-ctx 256"):
        LlamaCppBackend(path, n_ctx=512, n_threads=1)
    with pytest.raises(ConfigError, match="trained context window of 256"):
        LlamaCppBackend(path, n_ctx=512, n_threads=1, slots=2)
    assert LlamaCppBackend(path, n_ctx=256, n_threads=1).n_ctx == 256


def test_tokenizer_mismatch_is_refused(tiny_gguf_dir, target, tmp_path):
    from tiny_gguf import write_tiny_gguf

    other = LlamaCppBackend(write_tiny_gguf(tmp_path / "other.gguf", n_embd=32), n_ctx=128, n_threads=1)
    assert other.vocab_size == target.vocab_size  # same size: texts must be compared too
    # A toy backend has a different vocabulary altogether.
    from draftwise.backends.toy import ToyBackend, ToyModel

    with pytest.raises(TokenizerMismatchError, match="does not share the tokenizer"):
        Engine(target, [ModelDrafter(ToyBackend(ToyModel(vocab_size=target.vocab_size)))])
    Engine(target, [ModelDrafter(other)])  # same tokenizer: accepted


@pytest.fixture(scope="module")
def tree_target(tiny_gguf_dir):
    backend = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=512, n_threads=1, n_seq_max=4)
    yield backend
    backend.close()


def test_llamacpp_declares_what_it_can_do(tiny_gguf_dir, tree_target):
    from draftwise.backends.base import Capabilities

    assert tree_target.capabilities == Capabilities(
        dtype="gguf", max_branches=4, batching=True, prefix_sharing=True, interruption=True
    )
    slotted = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=64, n_threads=1, slots=2)
    try:
        assert slotted.capabilities.num_slots == slotted.num_slots == 2 and slotted.capabilities.max_branches == 1
        seq = slotted.sequence(1).capabilities  # decoded, batched and stopped through its owner
        assert (seq.num_slots, seq.batching, seq.prefix_sharing, seq.interruption) == (1, False, True, True)
    finally:
        slotted.close()


def test_tree_second_branch_committed_llamacpp(tree_target):
    from draftwise.verify import greedy_verify_tree

    ids = tree_target.tokenizer.encode(PROMPT)
    tree_target.reset()
    tree_target.prefill(ids[:-1])
    truth = []
    for _ in range(4):  # the plain greedy continuation, one token at a time
        truth.append(int(tree_target.extend([ids[-1]] if not truth else [truth[-1]])[0].argmax()))
    tree_target.reset()
    tree_target.prefill(ids[:-1])
    wrong = [(truth[0] + 1) % 256, truth[1], truth[2]]
    logits = tree_target.extend_tree(ids[-1], [wrong, truth[:3]])
    branch, verdict = greedy_verify_tree([wrong, truth[:3]], [x.argmax(-1) for x in logits])
    assert (branch, verdict.num_accepted, verdict.next_token) == (1, 3, truth[3])
    tree_target.commit_branch(branch, verdict.num_accepted)
    assert tree_target.cached_ids == ids + truth[:3]
    # The cache really holds the committed branch: the next token equals a fresh run's.
    after = tree_target.extend([truth[3]])[0].argmax()
    tree_target.reset()
    fresh = tree_target.extend(ids + truth[:4])[-1].argmax()
    assert after == fresh


@pytest.mark.parametrize("branches", [2, 4])
def test_tree_greedy_equivalence_llamacpp(tree_target, branches):
    engine = Engine(tree_target, [NgramDrafter(1, 3)])
    sampling = SamplingParams(max_tokens=40, ignore_eos=True)
    plain = engine.generate(PROMPT, sampling=sampling, speculation=SpeculationConfig(enabled=False))
    tree = engine.generate(
        PROMPT,
        sampling=sampling,
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4, max_branches=branches),
    )
    assert tree.token_ids == plain.token_ids and tree.stats.num_tree_steps > 0


@pytest.mark.parametrize("drafter", ["twin", "ngram", "grammar"])
@pytest.mark.parametrize("k", [1, 3])
def test_constrained_greedy_speculative_equals_constrained_plain(tiny_gguf_dir, drafter, k):
    """Structured output on llama.cpp: the regex holds, forced tokens skip decisions, and
    speculation (a perfect draft model, n-gram, the grammar drafter) changes nothing."""
    import re

    from draftwise.constraints import Constraint
    from draftwise.drafters.grammar import GrammarDrafter

    # NOTE: no two spaces in a row: the tiny vocabulary's one merge ("Ġ Ġ") has no token of its
    # own, so llama.cpp tokenises "  " to nothing, which misleads llguidance's forced-text path.
    pattern = r"def [a-z]{2,6}\(a, b\):\n\treturn a [+*-] b\n"
    target = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=512, n_threads=1)
    twin = LlamaCppBackend(tiny_gguf_dir / "twin.gguf", n_ctx=512, n_threads=1)
    try:
        engine = Engine(target, [ModelDrafter(twin, name="twin"), NgramDrafter(1, 3), GrammarDrafter()])
        sampling = SamplingParams(max_tokens=60, constraint=Constraint.regex(pattern))
        plain = engine.generate(PROMPT, sampling=sampling, speculation=SpeculationConfig(enabled=False))
        spec = engine.generate(
            PROMPT,
            sampling=sampling,
            drafters=[drafter],
            speculation=SpeculationConfig(policy="fixed", max_draft_tokens=k),
        )
        assert re.fullmatch(pattern, plain.text) and plain.finish_reason == "stop"
        assert spec.token_ids == plain.token_ids
        # The fixed text is forced (or drafted and accepted, when a draft reached it first).
        assert spec.stats.num_forced_tokens > 0
        assert spec.stats.num_forced_tokens + spec.stats.num_accepted >= len("def ") + len("(a, b):\n\treturn a ")
        if drafter == "twin":
            assert spec.stats.acceptance_rate == 1.0
    finally:
        target.close()
        twin.close()


@pytest.mark.parametrize(
    "verify_per_token, draft_ms, loaded, why",
    [
        (0.6, 21.0, False, "even with every draft token accepted"),
        (0.3, 10.0, True, ""),
        (0.05, 3.0, True, ""),
    ],
)
def test_a_draft_model_that_cannot_pay_is_not_kept(tiny_gguf_dir, monkeypatch, verify_per_token, draft_ms, loaded, why):
    """Synthetic calibrations: a draft token at 0.7 of a target token and verification of k tokens
    at 0.6 k plain steps (a CPU) -> never worth it, so the auto default unloads it. A draft token
    at 1/3 of a target token and verification at 0.3 k: 1.55x if every token were accepted, at the
    70% the policy starts from at most 1.04x: kept, since the policy probes it and learns where it
    is accepted (policy.auto.PROBE_*). With nearly free verification and a draft token at 1/10 of
    a target token (a GPU) it stays. --policy fixed
    keeps it either way."""
    from draftwise import calibrate
    from draftwise.calibrate import CostCurve
    from draftwise.loading import LoadOptions, load_engine

    def fake(backend, **_):
        if backend.name == "draft.gguf":
            return CostCurve.linear(draft_ms, draft_ms, max_n=64)
        return CostCurve(tuple((n, 30.0 * (1 + verify_per_token * (n - 1))) for n in range(1, 66)))

    monkeypatch.setattr(calibrate, "load_or_measure", fake)
    options = LoadOptions(n_ctx=256, threads=1)
    engine = load_engine(str(tiny_gguf_dir / "target.gguf"), f"ngram,{tiny_gguf_dir / 'draft.gguf'}", options=options)
    try:
        assert ("draft" in [d.name for d in engine.drafters]) == loaded
        assert bool(engine.skipped_drafters) == (not loaded)
        stats = engine.generate(
            "hello",
            sampling=SamplingParams(max_tokens=4),
            speculation=SpeculationConfig(policy="fixed", max_draft_tokens=2),
            drafters=["ngram"],
        ).stats
        assert ("draft" in stats.to_dict()["skipped_drafters"]) == (not loaded)
        if not loaded:
            assert why in engine.skipped_drafters["draft"] and "x of plain decoding" in engine.skipped_drafters["draft"]
            with pytest.raises(ConfigError, match="was not loaded"):
                engine.generate("hello", drafters=["draft"])
    finally:
        engine.target.close()
    fixed = load_engine(
        str(tiny_gguf_dir / "target.gguf"),
        str(tiny_gguf_dir / "draft.gguf"),
        options=options,
        speculation=SpeculationConfig(policy="fixed"),
    )
    assert [d.name for d in fixed.drafters] == ["draft"]
    fixed.target.close()


# ---------------------------------------------------------------- slots (continuous batching)
def test_sequences_are_independent_in_one_batch(tiny_gguf_dir, target):
    """Two sequences decoded in one forward give each its own logits: those of a lone run."""
    batched = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=512, n_threads=1, slots=3)
    try:
        a, b = target.tokenizer.encode(PROMPT)[:12], target.tokenizer.encode("x = [1, 2, 3]\nprint(x)\n")[:9]
        seq_a, seq_b = batched.sequence(1), batched.sequence(2)
        out_a, out_b, out_0 = batched.extend_batch([(seq_a, a, 3), (seq_b, b, 1), (batched, b[:4], 0)])
        assert out_a.shape == (3, batched.vocab_size) and out_b.shape == (1, batched.vocab_size) and len(out_0) == 0
        assert seq_a.cached_ids == a and seq_b.cached_ids == b and batched.cached_ids == b[:4]
        target.reset()
        lone_a = target.extend(a)[-3:]
        target.reset()
        lone_b = target.extend(b)[-1:]
        np.testing.assert_array_equal(out_a.argmax(-1), lone_a.argmax(-1))
        np.testing.assert_array_equal(out_b.argmax(-1), lone_b.argmax(-1))
        # Another batch shape takes other kernels (~1e-3 relative here); cross-talk would not be
        # small. The exact test: the same shape with other text in the other sequence.
        np.testing.assert_allclose(out_a, lone_a, rtol=0, atol=0.1)
        other = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=512, n_threads=1, slots=3)
        try:
            b_other = [(t * 7 + 3) % 200 + 1 for t in b]
            same_a, _, _ = other.extend_batch(
                [(other.sequence(1), a, 3), (other.sequence(2), b_other, 1), (other, b_other[:4], 0)]
            )
            np.testing.assert_array_equal(same_a, out_a)
        finally:
            other.close()
        seq_a.truncate(5)  # per-sequence removal leaves the others alone
        assert seq_a.cached_ids == a[:5] and seq_b.cached_ids == b
        again = seq_b.extend(a[:2])
        target.reset()
        np.testing.assert_array_equal(again.argmax(-1), target.extend(b + a[:2])[-2:].argmax(-1))
        with pytest.raises(ContextOverflowError):
            seq_a.extend([1] * 600)
        assert seq_a.cached_ids == a[:5]
        with pytest.raises(ConfigError, match="trees"):
            LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=64, slots=2, n_seq_max=2)
    finally:
        batched.close()


def test_batched_greedy_equals_single_llamacpp(tiny_gguf_dir):
    from draftwise.batching import Batcher

    prompts = [PROMPT, "x = [1, 2, 3]\nprint(x)\nx = [1, 2", "class A:\n    pass\n\nclass B", "a b a b a b"]
    specs = [
        SpeculationConfig(policy="fixed", max_draft_tokens=4),
        SpeculationConfig(policy="fixed", max_draft_tokens=2),
        SpeculationConfig(enabled=False),
        SpeculationConfig(policy="fixed", max_draft_tokens=3),
    ]
    sampling = SamplingParams(max_tokens=24, ignore_eos=True)
    single_target = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=512, n_threads=1)
    single_draft = LlamaCppBackend(tiny_gguf_dir / "draft.gguf", n_ctx=512, n_threads=1)
    target = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=512, n_threads=1, slots=3)
    draft = LlamaCppBackend(tiny_gguf_dir / "draft.gguf", n_ctx=512, n_threads=1, slots=3)
    try:
        single = Engine(single_target, [NgramDrafter(1, 3), ModelDrafter(single_draft, name="draft")])
        drafter_sets = [["ngram"], ["draft"], None, ["draft", "ngram"]]
        expected = [
            single.generate(p, sampling=sampling, speculation=s, drafters=d).token_ids
            for p, s, d in zip(prompts, specs, drafter_sets)
        ]
        engine = Engine(target, [NgramDrafter(1, 3), ModelDrafter(draft, name="draft")])
        gens = [
            engine.stream(p, sampling=sampling, speculation=s, drafters=d)
            for p, s, d in zip(prompts, specs, drafter_sets)
        ]
        results = Batcher(engine, prefill_chunk=5).run(gens)  # 4 requests, 3 slots: one joins later
        single_target.reset()
        for prompt, result, want in zip(prompts, results, expected):
            got = result.token_ids
            if got == want:
                continue
            # llama.cpp is not exact: another batch shape moves logits by ~1e-3 relative, which
            # may flip a near-tie of these random models. Anything else is a bug.
            first = next(i for i, (x, y) in enumerate(zip(got, want)) if x != y)
            single_target.reset()
            logits = single_target.extend(single_target.tokenizer.encode(prompt) + want[:first])[-1]
            top = np.sort(logits)[-2:]
            assert top[1] - top[0] < 0.02, f"batched output diverged at {first} without a near-tie"
    finally:
        for b in (single_target, single_draft, target, draft):
            b.close()


def _slotted(tiny_gguf_dir, slots, prompt, sampling):
    """A target with slots, an engine over it (fixed policy, n-gram drafts), the prompt's answer
    decoded alone (in slot 0, which then forgets it) and its ids."""
    target = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=512, n_threads=1, slots=slots)
    engine = Engine(target, [NgramDrafter(1, 3)], speculation=SpeculationConfig(policy="fixed"))
    alone = engine.generate(prompt, sampling=sampling).token_ids
    target.reset()  # slot 0 forgets; the first request of a test reads the prompt in slot 0
    return target, engine, alone, engine.encode_prompt(prompt)


def test_a_slot_takes_the_prompt_prefix_another_slot_holds(tiny_gguf_dir):
    """n > 1 choices of one prompt, or an editor's completions of one prompt: the second slot
    shares the first one's cached prompt (llama.cpp KV cells, no copy, no second read) and
    decodes as it would have with its own read; a slot not allowed to share reads it again."""
    from draftwise.batching import MIN_SHARED, Batcher

    prompt = PROMPT * 3
    sampling = SamplingParams(max_tokens=12, ignore_eos=True)
    target, engine, alone, ids = _slotted(tiny_gguf_dir, 3, prompt, sampling)
    try:
        assert len(ids) > MIN_SHARED + 2

        batcher = Batcher(engine, prefill_chunk=None)
        first = engine.stream(prompt, sampling=sampling)
        assert batcher.add(first, share_from=lambda i: True) == 0
        batcher.step()  # slot 0 has read the prompt and decodes
        second = engine.stream(prompt, sampling=sampling)
        slot = batcher.add(second, share_from=lambda i: True)
        assert slot != 0 and engine.slot(slot).target.cached_ids == ids[:-1]
        third = engine.stream(prompt, sampling=sampling)
        other = batcher.add(third, share_from=lambda i: False)  # another tenant's slots: no sharing
        while batcher.active:
            batcher.step()
        results = [g.result for g in (first, second, third)]
        assert [r.stats.num_reused_tokens for r in results] == [0, len(ids) - 1, 0]
        assert other not in (0, slot)
        for r in results:
            assert r.token_ids == alone
        assert engine.slot(0).target.cached_ids[: len(ids)] == ids  # the source kept its cache
    finally:
        target.close()


def test_an_interrupted_forward_leaves_the_cache_as_before(tiny_gguf_dir):
    """llama.cpp's abort callback stops a forward part-way (between graph nodes, or between a
    long prompt's batches); the call raises ForwardInterrupted and the cache holds what it held
    before, so the next read continues as if the forward never ran. Outside `interruptible`
    nothing is stopped."""
    from draftwise.errors import ForwardInterrupted

    backend = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=512, n_threads=1, n_batch=16)
    try:
        ids = backend.tokenizer.encode(PROMPT * 3)
        assert len(ids) > 40
        backend.prefill(ids[:8])
        fresh = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=512, n_threads=1, n_batch=16)
        want = fresh.extend(ids)[-5:]
        fresh.close()
        calls = {"n": 0}

        def after(n):
            def check():
                calls["n"] += 1
                return calls["n"] > n

            return check

        calls["n"] = 0
        with backend.interruptible(after(10**9)):  # counts what a whole read asks
            backend.extend(ids[8:])
        backend.truncate(8)
        total = calls["n"]
        # mid-graph (the first batch), mid-prompt (a later batch), before anything
        for n in (5, total // 2, 0):
            calls["n"] = 0
            with backend.interruptible(after(n)):
                with pytest.raises(ForwardInterrupted):
                    backend.extend(ids[8:])
            assert backend.cached_ids == ids[:8], n
        with pytest.raises(BackendError), backend.interruptible(lambda: False), backend.interruptible(lambda: False):
            pass
        got = backend.extend(ids[8:])[-5:]  # outside: never stopped
        np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
        np.testing.assert_allclose(got, want, atol=5e-3)
    finally:
        backend.close()


def test_a_prompt_read_stops_when_its_request_is_superseded(tiny_gguf_dir):
    """The forward reading a prompt's last chunk (what changes between an editor's requests)
    stops part-way once every request in it is cancelled: the request ends as cancelled with its
    slot's cache as before that forward, and the next request on the slot decodes as it would
    have alone. An earlier chunk (what the newer request reuses) is read to its end."""
    from draftwise.batching import Batcher

    prompt = PROMPT * 3
    sampling = SamplingParams(max_tokens=8, ignore_eos=True)
    target, engine, alone, ids = _slotted(tiny_gguf_dir, 2, prompt, sampling)
    try:
        assert len(ids) > 30
        batcher = Batcher(engine, prefill_chunk=10)
        asked = {"armed": False, "n": 0}

        def superseded_mid_forward():  # once armed: False when reaped before the step, then True
            if not asked["armed"]:
                return False
            asked["n"] += 1
            return asked["n"] > 1

        first = engine.stream(prompt, sampling=sampling, cancelled=superseded_mid_forward)
        slot = batcher.add(first, share_from=lambda i: False)
        batcher.step()  # reads 10 prompt tokens
        asked["armed"] = True  # cancelled during the next forward, a middle chunk: read whole
        batcher.step()
        assert batcher.num_interrupted == 0 and len(engine.slot(slot).target.cached_ids) == 20
        asked.update(armed=False, n=0)
        while len(batcher.active[0].pending) > 10:
            batcher.step()
        read = engine.slot(slot).target.cached_ids
        asked["armed"] = True  # cancelled during the last chunk's forward: stopped
        events = batcher.step()
        assert batcher.num_interrupted == 1 and not batcher.active
        assert first.result.stats.finish_reason == "cancelled" and any(e.generation is first for e in events)
        assert engine.slot(slot).target.cached_ids == read  # nothing of the stopped forward stays
        second = engine.stream(prompt, sampling=sampling)
        assert batcher.add(second, share_from=lambda i: False) == slot
        while batcher.active:
            batcher.step()
        assert second.result.token_ids == alone
        assert second.result.stats.num_reused_tokens == len(read)
    finally:
        target.close()
