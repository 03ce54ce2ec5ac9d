"""String-level drafting across vocabularies (drafters/stringlevel.py): the draft's own text
re-encoded for the target, never a token starting inside committed text, never a last token
more text could merge into, never the target's end of generation; and the drafter's mode."""

import numpy as np
import pytest

from draftwise.backends.toy import CharTokenizer, PieceTokenizer, ToyBackend, ToyModel
from draftwise.drafters.crossvocab import CrossVocabDrafter
from draftwise.drafters.stringlevel import boundaries, reencode
from draftwise.loading import LoadOptions
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig

# A target tokenizer that merges: "ab", "\n\n", " a" are single tokens.
MERGING = PieceTokenizer(["a", "b", "ab", " ", " a", "\n", "\n\n", "c"])


def spell(ids):
    return MERGING.decode(list(ids))


def test_a_token_merging_across_the_committed_end_is_not_drafted():
    # "a" committed, "b a" new: the whole text encodes "ab", " a": "ab" starts inside the committed
    # text, so the new text is encoded alone: "b", " a" (the last dropped: "c" could follow, " ac"?).
    out = reencode(MERGING, "a", "b a", complete=False)
    assert spell(out.token_ids) == "b" and out.num_chars == 1
    out = reencode(MERGING, "a", "b a", complete=True)
    assert spell(out.token_ids) == "b a" and [MERGING.token_text(t) for t in out.token_ids] == ["b", " a"]
    out = reencode(MERGING, "c\n", "\nab", complete=True)  # "\n\n" would straddle the end
    assert [MERGING.token_text(t) for t in out.token_ids] == ["\n", "ab"]


def test_the_committed_text_is_kept_where_the_boundary_holds():
    out = reencode(MERGING, "c ", "ab c", complete=False)  # "c", " ", "ab", " ", "c": " c" is no token
    assert [MERGING.token_text(t) for t in out.token_ids] == ["ab", " "] and out.num_chars == 3


@pytest.mark.parametrize("seed", range(30))
def test_a_re_encoded_draft_is_what_the_targets_tokenizer_gives(seed):
    """Random texts of the merging alphabet: the draft spells a prefix of the new text, starts at
    the committed end, and equals the target's own tokens for the text that follows (which it
    would not if a trailing token could merge with more text)."""
    rng = np.random.default_rng(seed)
    chars = list("ab \nc")
    committed = "".join(rng.choice(chars, size=int(rng.integers(1, 4))))
    new = "".join(rng.choice(chars, size=int(rng.integers(1, 6))))
    more = "".join(rng.choice(chars, size=3))
    out = reencode(MERGING, committed, new, complete=False)
    assert spell(out.token_ids) == new[: out.num_chars]
    # Whatever the draft writes next, the target's tokenizer starts with the same tokens.
    later = reencode(MERGING, committed, new + more, complete=True)
    assert later.token_ids[: len(out.token_ids)] == out.token_ids


def test_boundaries_skip_a_token_ending_inside_a_character():
    tok = CharTokenizer(4, "aé")
    assert boundaries(tok, tok.encode("aé"), "aé") == [(0, 0), (1, 1), (2, 2)]


# ---------------------------------------------------------------------------- the drafter
TARGET_TOK = CharTokenizer(10, "abcde fgh")
DRAFT_PIECES = ["a", "c", "ab", "e", "x", " ", "dd", "b", " a", "g", "d", "f", "h"]


def make_drafter(level="string", **model):
    model = ToyModel(vocab_size=len(DRAFT_PIECES) + 1, order=1, **{"seed": 4, "sharpness": 2.0, **model})
    backend = ToyBackend(model, tokenizer=PieceTokenizer(DRAFT_PIECES), name="draft")
    return CrossVocabDrafter(backend, TARGET_TOK, 10, draft_level=level)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_string_draft_is_the_drafts_own_text_deterministic(temperature):
    d = make_drafter()
    context = [5, 6]  # "e "
    num_drafted = 0
    for seed in range(10):
        spec = SpeculationConfig(draft_temperature=temperature or None)  # else the draft's argmax
        d.begin(SamplingParams(temperature=temperature, seed=seed), spec, prompt=context[:1])
        draft = d.propose(context, 4)
        assert draft.draft_probs is None and len(draft) <= 4
        # The draft model's own text, less at least its last character (which more could extend).
        text = TARGET_TOK.decode(list(draft.token_ids))
        assert d.last_written.startswith(text) and len(text) < len(d.last_written)
        assert draft.token_ids == tuple(TARGET_TOK.encode(text))
        num_drafted += len(draft)
    assert num_drafted > 10
    if temperature == 0:
        assert d.last_written == "ab ab" and TARGET_TOK.decode(list(draft.token_ids)) == "ab a"


def test_the_drafts_end_stops_the_text_and_is_not_drafted():
    d = make_drafter(eos_bias=8.0)  # the draft ends its text at once, or after a token or two
    for seed in range(10):
        spec = SpeculationConfig(draft_temperature=1.0)
        d.begin(SamplingParams(temperature=1.0, seed=seed), spec, prompt=[1])
        assert 0 not in d.propose([1, 2], 5).token_ids


def test_the_level_is_chosen_per_request():
    d = make_drafter(level="auto")
    d.begin(SamplingParams(), SpeculationConfig(), prompt=[1])
    assert d._string
    d.begin(SamplingParams(temperature=0.7), SpeculationConfig(), prompt=[1])
    assert not d._string
    with pytest.raises(ConfigError, match="draft_level"):
        make_drafter(level="word")
    with pytest.raises(ConfigError, match="draft_level"):
        LoadOptions(draft_level="word")
