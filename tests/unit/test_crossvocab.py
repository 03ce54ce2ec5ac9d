"""The cross-vocabulary drafter on toy backends of two vocabularies: the shared vocabulary, tokens
outside it never drafted, the draft's ids kept in step by re-encoding only the tail, the prompt
mapped into the draft's template or a transcript, and greedy output equal to plain decoding."""

import numpy as np
import pytest

from draftwise.backends.toy import CharTokenizer, PieceTokenizer, ToyBackend, ToyModel
from draftwise.drafters.crossvocab import (
    ChatParts,
    CrossVocabDrafter,
    chat_parts,
    draft_prompt,
    shared_vocabulary,
    tail_text,
)
from draftwise.engine import Engine, TokenizerMismatchError
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig

ALPHABET = "abcde fgh"
TARGET_TOK = CharTokenizer(len(ALPHABET) + 1, ALPHABET)  # </s> a b c d e " " f g h
# Every target text in another order, and "ab", "x", "dd", " a": the draft's own.
DRAFT_PIECES = ["a", "c", "ab", "e", "x", " ", "dd", "b", " a", "g", "d", "f", "h"]
TARGET = ToyModel(vocab_size=TARGET_TOK.vocab_size, order=2, seed=3, sharpness=2.0, eos_bias=-6.0)
PROMPTS = [[1, 2, 6, 1, 3], [8, 8, 1], [5]]


def draft_backend(seed=4, sharpness=2.0, **kwargs):
    model = ToyModel(vocab_size=len(DRAFT_PIECES) + 1, order=1, seed=seed, sharpness=sharpness)
    return ToyBackend(model, tokenizer=PieceTokenizer(DRAFT_PIECES), name="draft", **kwargs)


def drafter(**kwargs):
    return CrossVocabDrafter(draft_backend(), TARGET_TOK, TARGET_TOK.vocab_size, name="draft", **kwargs)


def test_the_shared_vocabulary_maps_equal_texts_one_to_one():
    pieces = ["a", "c", "ab", "e", "x", " ", "dd", "b", " a", "g"]
    vocab = shared_vocabulary(TARGET_TOK, 10, PieceTokenizer(pieces), 11)
    pairs = {(PieceTokenizer(pieces).token_text(d), int(t)) for d, t in zip(vocab.draft_ids, vocab.target_ids)}
    assert pairs == {("a", 1), ("c", 3), ("e", 5), (" ", 6), ("b", 2), ("g", 8)}
    assert vocab.to_target[3] == -1 and vocab.to_target[5] == -1  # "ab", "x": the draft's own
    assert all(vocab.to_target[vocab.to_draft[t]] == t for t in vocab.target_ids)
    logits = np.arange(11, dtype=np.float64)
    row = vocab.target_logits(logits)  # the shared tokens' logits at their target ids
    assert row[1] == 1.0 and row[2] == 8.0 and row[8] == 10.0 and np.isneginf(row[[0, 4, 7, 9]]).all()


def test_a_draft_sharing_too_little_is_refused_by_name():
    with pytest.raises(TokenizerMismatchError, match="shares 1 of its 5 tokens"):
        shared_vocabulary(TARGET_TOK, 10, PieceTokenizer(["a", "xy", "zz", "qq"]), 5)


def test_a_bad_prompt_mode_is_refused():
    with pytest.raises(ConfigError, match="prompt_mode"):
        drafter(prompt_mode="html")


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(),  # greedy: the argmax over the shared tokens
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.5, top_k=3),
        SamplingParams(temperature=0.7, top_p=0.8, repeat_penalty=1.3),
    ],
)
def test_no_token_outside_the_shared_vocabulary_is_ever_drafted(sampling):
    """The draft puts most of its mass on its own tokens ("ab", "dd", " a", ...), yet every
    proposal is a shared token, and every draft row is a distribution over the shared ones."""
    d = CrossVocabDrafter(draft_backend(seed=9, sharpness=4.0), TARGET_TOK, 10, draft_level="token")
    shared = set(d.vocab.target_ids.tolist())
    assert shared == set(range(1, 10))  # every character; EOS has no text
    outside = ~np.isin(np.arange(10), list(shared))
    num_drafted = 0
    for seed in range(40):
        d.begin(SamplingParams(**{**sampling.__dict__, "seed": seed}), SpeculationConfig(), prompt=[1, 2])
        context = [1, 2, *np.random.default_rng(seed).integers(1, 10, size=seed % 7).tolist()]
        draft = d.propose(context, 5)
        num_drafted += len(draft)
        assert set(draft.token_ids) <= shared
        if draft.draft_probs is not None:
            assert draft.draft_probs.shape == (len(draft), 10)
            assert np.allclose(draft.draft_probs.sum(axis=1), 1.0) and not draft.draft_probs[:, outside].any()
    assert num_drafted > 40


class RecordingTokenizer(PieceTokenizer):
    """Records every text the drafter encodes."""

    def __init__(self, pieces):
        super().__init__(pieces)
        self.encoded: list[str] = []

    def encode(self, text, **kwargs):
        self.encoded.append(text)
        return super().encode(text, **kwargs)


def run_recorded(pieces, k=3, max_tokens=80, level="token"):
    tokenizer = RecordingTokenizer(pieces)
    model = ToyModel(vocab_size=len(pieces) + 1, order=1, seed=4, sharpness=2.0)
    d = CrossVocabDrafter(ToyBackend(model, tokenizer=tokenizer), TARGET_TOK, 10, reencode_tokens=2, draft_level=level)
    engine = Engine(ToyBackend(TARGET, tokenizer=TARGET_TOK), [d])
    prompt = [1, 2, 6, 1, 3, 7, 7, 1]
    spec = SpeculationConfig(policy="fixed", max_draft_tokens=k)
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    result = engine.generate(prompt_ids=prompt, sampling=sampling, speculation=spec)
    assert len(result.token_ids) == max_tokens and result.stats.num_drafted > 0
    return d, tokenizer, prompt, result


def test_the_draft_follows_the_text_by_re_encoding_only_the_tail():
    """After the prompt, each step encodes the new tokens' text and at most REENCODE_TOKENS
    before them, never the whole context; the draft's ids always spell the committed text."""
    k = 3
    d, tokenizer, prompt, result = run_recorded(DRAFT_PIECES, k)
    tails = tokenizer.encoded[1:]  # the first: the prompt itself, mapped once in begin()
    assert len(tails) >= result.stats.num_steps - 2  # not the first (nothing new), nor a last step of k 0
    # One character per target token: a step re-encodes its new tokens (at most k + 1) and the
    # REENCODE_TOKENS (2) before them.
    assert 1 <= max(len(t) for t in tails) <= 2 + k + 1
    base = len(d._prompt_draft)
    assert tokenizer.decode(d._synced_draft[base:]) == TARGET_TOK.decode(d._synced_target[len(prompt) :])
    # The draft's cache holds its ids (less the last drafted, which a proposal never feeds).
    cached = d.backend.cached_ids
    assert len(cached) >= len(d._synced_draft) - 1 and cached == d._synced_draft[: len(cached)]


def test_text_the_draft_cannot_spell_is_re_encoded_in_a_bounded_tail():
    """A draft without "d", "f", "h" drops them (its text then differs from the target's): no anchor
    is found inside such a tail, yet what a step re-encodes stays bounded, not the whole answer."""
    from draftwise.drafters.crossvocab import ANCHOR_WINDOW

    k = 3
    _, tokenizer, _, result = run_recorded(DRAFT_PIECES[:-3], k, max_tokens=120)
    assert max(len(t) for t in tokenizer.encoded[1:]) <= 2 + ANCHOR_WINDOW + k + 1 < 120


def test_tail_text_keeps_the_text_the_tail_adds():
    assert tail_text(TARGET_TOK, [1, 6, 2], 1) == " b"
    assert tail_text(TARGET_TOK, [1, 6, 2], 0) == "a b"


def test_chat_parts_read_the_template_and_parse_a_rendered_prompt():
    parts = chat_parts(TARGET_TOK)  # the toy's template: "u:hi\na:"
    assert parts == ChatParts({"system": ("s:", "\n"), "user": ("u:", "\n"), "assistant": ("a:", "\n")}, "a:")
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "a"},
    ]
    assert parts.parse(TARGET_TOK.apply_chat_template(messages)) == messages
    assert parts.parse("not a chat") is None


def test_the_prompt_in_the_drafts_template_or_as_a_transcript():
    alphabet = "abcdefghijklmnopqrstuvwxyzUA :\n"
    target = CharTokenizer(len(alphabet) + 1, alphabet)
    draft = CharTokenizer(len(alphabet) + 1, "\n:" + alphabet[:-2])  # the same texts, other ids
    messages = [{"role": "user", "content": "hi there"}]
    prompt = target.encode(target.apply_chat_template(messages))
    parts = chat_parts(target)
    assert draft.decode(draft_prompt(target, draft, prompt, "template", parts)) == "u:hi there\na:"
    assert draft.decode(draft_prompt(target, draft, prompt, "plain", parts)) == "User: hi there\n\nAssistant: "
    text = target.encode("just text")  # no chat: its text, either way
    assert draft.decode(draft_prompt(target, draft, text, "template", parts)) == "just text"


def make_engine(slots=1, level="token"):
    d = CrossVocabDrafter(
        draft_backend(slots=slots), TARGET_TOK, TARGET_TOK.vocab_size, name="draft", draft_level=level
    )
    return Engine(ToyBackend(TARGET, slots=slots, tokenizer=TARGET_TOK), [d])


@pytest.mark.parametrize("level", ["token", "string"])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_greedy_equivalence_across_vocabularies(k, level):
    engine = make_engine(level=level)
    spec = SpeculationConfig(policy="fixed", max_draft_tokens=k)
    num_drafted = num_accepted = 0
    for prompt in PROMPTS:
        sampling = SamplingParams(max_tokens=60)
        plain = engine.generate(prompt_ids=prompt, sampling=sampling, speculation=SpeculationConfig(enabled=False))
        result = engine.generate(prompt_ids=prompt, sampling=sampling, speculation=spec, drafters=["draft"])
        assert result.token_ids == plain.token_ids
        num_drafted += result.stats.num_drafted
        num_accepted += result.stats.num_accepted
    assert num_drafted > 0 and 0 < num_accepted < num_drafted  # some accepted, some rejected


def test_a_twin_over_another_vocabulary_is_accepted_whole():
    """A draft computing the target's logits, mapped: every shared token it drafts is accepted."""
    num_draft = len(DRAFT_PIECES) + 1
    vocab = shared_vocabulary(TARGET_TOK, 10, PieceTokenizer(DRAFT_PIECES), num_draft)

    def twin(context):  # the target's next-token logits, read through the draft's tokens' text
        ids = TARGET_TOK.encode(PieceTokenizer(DRAFT_PIECES).decode(context))
        row = np.full(num_draft, -30.0)
        row[vocab.draft_ids] = TARGET.logits(ids)[vocab.target_ids]
        return row

    d = CrossVocabDrafter(
        ToyBackend(logits_fn=twin, vocab_size=num_draft, tokenizer=PieceTokenizer(DRAFT_PIECES)),
        TARGET_TOK,
        10,
        vocab=vocab,
        draft_level="token",
    )
    engine = Engine(ToyBackend(TARGET, tokenizer=TARGET_TOK), [d])
    prompt = [1, 6, 2, 6, 3]  # "a b c": the toy target reads the last two tokens only
    result = engine.generate(
        prompt_ids=prompt,
        sampling=SamplingParams(max_tokens=40),
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4),
    )
    assert result.stats.num_drafted > 10
    # Every rejection is a target token the draft cannot write (outside the shared vocabulary).
    outside = set(range(10)) - set(vocab.target_ids.tolist())
    assert result.stats.num_accepted == result.stats.num_drafted or outside & set(result.token_ids)


def test_auto_probes_a_draft_of_another_vocabulary_learns_it_and_stays_exact():
    """Priced at its prior (0.6 per token) the draft would not pay on these costs; the policy probes
    it, learns that the twin is accepted, and drafts with it; the answer is plain decoding's."""
    from draftwise.calibrate import CostCurve
    from draftwise.policy.auto import AutoPolicy

    num_draft = len(DRAFT_PIECES) + 1
    vocab = shared_vocabulary(TARGET_TOK, 10, PieceTokenizer(DRAFT_PIECES), num_draft)

    def twin(context):
        ids = TARGET_TOK.encode(PieceTokenizer(DRAFT_PIECES).decode(context))
        row = np.full(num_draft, -30.0)
        row[vocab.draft_ids] = TARGET.logits(ids)[vocab.target_ids]
        return row

    backend = ToyBackend(logits_fn=twin, vocab_size=num_draft, tokenizer=PieceTokenizer(DRAFT_PIECES))
    d = CrossVocabDrafter(backend, TARGET_TOK, 10, vocab=vocab, draft_level="token")
    policy = AutoPolicy(target_cost=CostCurve.linear(30.0, 12.0), draft_costs={"draft": CostCurve.linear(5.0, 5.0)})
    policy.time.observe = lambda *args: None  # the toy's microseconds are not the costs given
    engine = Engine(ToyBackend(TARGET, tokenizer=TARGET_TOK), [d], policy=policy)
    prompt = [1, 6, 2, 6, 3]
    sampling = SamplingParams(max_tokens=60, ignore_eos=True)
    plain = engine.generate(prompt_ids=prompt, sampling=sampling, speculation=SpeculationConfig(enabled=False))
    result = engine.generate(prompt_ids=prompt, sampling=sampling, speculation=SpeculationConfig(policy="auto"))
    assert result.token_ids == plain.token_ids
    assert result.stats.num_drafted > 20  # more than probes: it drafts once learnt


def test_parallel_slots_each_draft_on_their_own_sequence():
    engine = make_engine(slots=2)
    first = engine.drafters[0]
    second = first.for_slot(1)
    assert isinstance(second, CrossVocabDrafter) and second.vocab is first.vocab
    assert second.backend is first.backend.sequence(1)
    with pytest.raises(ConfigError, match="slot"):
        first.for_slot(2)


def test_memory_counts_the_cache_and_the_map():
    d = drafter()
    d.begin(SamplingParams(), SpeculationConfig(), prompt=[1, 2, 3])
    d.propose([1, 2, 3], 2)
    assert d.memory_bytes() == d.backend.kv_bytes()["used"] + d.vocab.nbytes > d.vocab.nbytes


def test_the_catch_up_the_policy_prices_is_the_prompt_first_then_the_new_tail():
    """catch_up: what the draft must feed before drafting, priced by the auto policy. At a
    request's first proposal the draft's whole prompt; after a proposal, the tokens committed
    since plus the re-encoded tail, never the context again."""
    d = drafter()
    prompt = [1, 2, 6, 1, 3, 7, 7, 1]
    d.begin(SamplingParams(), SpeculationConfig(), prompt)
    assert d.catch_up(prompt) == len(d._prompt_draft) > 1
    draft = d.propose(prompt, 3)
    context = [*prompt, *draft.token_ids[:1], 2]  # one drafted token accepted, then the target's own
    assert d.catch_up(context) == 2 + d.reencode_tokens
