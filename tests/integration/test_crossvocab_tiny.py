"""A draft model of another vocabulary on llama.cpp: two tiny random GGUFs (tests/tiny_gguf.py,
the draft's bytes at other ids and merged pieces of its own), greedy output equal to plain
decoding, and load() choosing the cross-vocabulary drafter (or refusing one that shares too little)."""

import pytest

from draftwise.backends.llamacpp import LlamaCppBackend
from draftwise.drafters import ModelDrafter
from draftwise.drafters.crossvocab import CrossVocabDrafter
from draftwise.engine import Engine, TokenizerMismatchError
from draftwise.loading import LoadOptions, load_engine
from draftwise.types import SamplingParams, SpeculationConfig

PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n", "the cat and the hat are in the tent"]
FIXED = SpeculationConfig(policy="fixed")


@pytest.fixture(scope="module")
def other_gguf(tiny_gguf_dir):
    from tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tiny_gguf_dir / "other_vocab.gguf", seed=1, other_vocab=True)


@pytest.fixture(scope="module")
def engine(tiny_gguf_dir, other_gguf):
    target = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=512, n_threads=1)
    draft = LlamaCppBackend(other_gguf, n_ctx=512, n_threads=1)
    engine = Engine(target, [CrossVocabDrafter(draft, target.tokenizer, target.vocab_size, name="draft")])
    yield engine
    target.close()
    draft.close()


def test_the_shared_vocabulary_of_the_tiny_models(engine):
    """Bytes that are whole characters (ASCII) and the two control tokens; not the draft's merged
    pieces, nor bytes that are part of a character."""
    drafter = engine.drafters[0]
    draft_tok, target_tok = drafter.backend.tokenizer, engine.tokenizer
    assert drafter.vocab.num_shared == 128 + 2
    the = next(t for t in range(draft_tok.vocab_size) if draft_tok.token_text(t) == "Ġthe")
    assert drafter.vocab.to_target[the] == -1
    x = draft_tok.encode("x", add_special=False)[0]
    assert target_tok.decode([int(drafter.vocab.to_target[x])]) == "x" and x != target_tok.encode("x")[0]


@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize(("prompt_mode", "level"), [("template", "token"), ("plain", "token"), ("template", "string")])
def test_greedy_equivalence_across_vocabularies_tiny(engine, k, prompt_mode, level):
    engine.drafters[0].prompt_mode = prompt_mode
    engine.drafters[0].draft_level = level
    sampling = SamplingParams(max_tokens=40, ignore_eos=True)
    num_drafted = 0
    for prompt in PROMPTS:
        for request in ({"prompt": prompt}, {"messages": [{"role": "user", "content": prompt}]}):
            plain = engine.generate(**request, sampling=sampling, speculation=SpeculationConfig(enabled=False))
            spec = SpeculationConfig(policy="fixed", max_draft_tokens=k)
            result = engine.generate(**request, sampling=sampling, speculation=spec)
            assert result.token_ids == plain.token_ids
            num_drafted += result.stats.num_drafted
    assert num_drafted > 0


def test_load_picks_the_drafter_by_vocabulary(tiny_gguf_dir, other_gguf):
    target = str(tiny_gguf_dir / "target.gguf")
    options = LoadOptions(n_ctx=256, threads=1, draft_prompt="plain")
    cross = load_engine(target, f"ngram,{other_gguf}", options=options, speculation=FIXED)
    same = load_engine(target, str(tiny_gguf_dir / "draft.gguf"), options=options, speculation=FIXED)
    try:
        drafter = cross.drafters[1]
        assert isinstance(drafter, CrossVocabDrafter) and drafter.name == "draft" and drafter.prompt_mode == "plain"
        assert type(same.drafters[0]) is ModelDrafter
    finally:
        for engine in (cross, same):
            engine.target.close()
            engine.drafters[-1].backend.close()


def test_a_draft_sharing_too_little_is_refused_at_load(tiny_gguf_dir, tmp_path):
    from tiny_gguf import write_tiny_gguf

    # 130 shared texts among 658 tokens: under crossvocab.MIN_SHARED.
    path = write_tiny_gguf(tmp_path / "alien.gguf", other_vocab=True, special_tokens=[f"<x{i}>" for i in range(400)])
    with pytest.raises(TokenizerMismatchError, match="alien.gguf.*cannot draft for target.*shares 130 of its 664"):
        load_engine(str(tiny_gguf_dir / "target.gguf"), str(path), options=LoadOptions(n_ctx=128), speculation=FIXED)
