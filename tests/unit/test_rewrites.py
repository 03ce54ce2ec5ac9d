"""The lookup's rewrites (drafters/rewrites.py): an answer's edits of the text it copies, learned
where the copy resumes and made in later proposals; exact under the engine whatever they propose."""

import numpy as np

from draftwise.backends.base import common_prefix_length
from draftwise.backends.toy import CharTokenizer, ToyBackend
from draftwise.drafters import NgramDrafter
from draftwise.engine import Engine
from draftwise.types import SamplingParams, SpeculationConfig

TOK = CharTokenizer(96)
SOURCE = (
    "def area(size):\n    return size * size\n\n"
    "def grow(size, step):\n    size += step\n    return area(size)\n\n"
    "def shrink(size):\n    return grow(size, -1)\n"
)
EDITED = SOURCE.replace("size", "size_max")


def walk(drafter: NgramDrafter, prompt: list[int], answer: list[int]) -> list[tuple[int, ...]]:
    """The drafter's proposal at every position of the answer, as the answer is written."""
    drafter.begin(SamplingParams(), SpeculationConfig(), prompt, TOK)
    return [drafter.propose(prompt + answer[:pos], 32).token_ids for pos in range(len(answer))]


def misses(proposals, answer) -> int:
    """Positions whose proposal is wrong from its first token."""
    return sum(common_prefix_length(p, answer[pos:]) == 0 for pos, p in enumerate(proposals))


def test_a_rename_is_proposed_at_its_later_occurrences():
    prompt, answer = TOK.encode(SOURCE + "#"), TOK.encode(EDITED)
    with_rewrites = walk(NgramDrafter(), prompt, answer)
    plain = walk(NgramDrafter(rewrites=False), prompt, answer)
    # Where the source says "size)" and the answer "size_max)" (the name's 3rd occurrence on):
    # the rewriting lookup proposes the new name, the plain one the old.
    third = EDITED.index("size_max", EDITED.index("size_max", EDITED.index("size_max") + 1) + 1)
    at = third + len("size")
    assert TOK.decode(with_rewrites[at][:4]) == "_max"
    assert TOK.decode(plain[at][:4]) != "_max"
    assert misses(with_rewrites, answer) < misses(plain, answer)


def test_a_change_is_made_only_where_the_word_is_the_same():
    # "Clear" became "ClearValue" (twice, learned); "ClearEvent" is another name and stays.
    source = "x = Clear(1)\ny = Clear(2)\nz = Clear(3)\nw = ClearEvent(4)\n"
    answer = source.replace("Clear(", "ClearValue(")
    prompt, ids = TOK.encode(source + "#"), TOK.encode(answer)
    proposals = walk(NgramDrafter(), prompt, ids)
    texts = [TOK.decode(p) for p in proposals]
    assert any("ClearValue(3)" in t for t in texts[: answer.index("ClearValue(3)") + 1] if t)
    assert not any("ClearValueEvent" in t for t in texts)


def test_a_change_the_answer_stops_making_is_dropped():
    # The first two "old" became "new"; from then on the answer keeps "old".
    source = "a = old + 1\nb = old + 2\nc = old + 3\nd = old + 4\ne = old + 5\nf = old + 6\n"
    answer = source.replace("old", "new", 2)
    prompt, ids = TOK.encode(source + "#"), TOK.encode(answer)
    drafter = NgramDrafter()
    proposals = walk(drafter, prompt, ids)
    wrong_new = sum(
        TOK.decode(p[: len(" new")]) == " new" and answer[pos : pos + 4] == " old" for pos, p in enumerate(proposals)
    )
    assert 1 <= wrong_new <= 2  # proposed where it was wrong, then no more
    changes = [c for cs in drafter.rewrites.changes.values() for c in cs if TOK.decode(c.new) == "new"]
    assert changes and not changes[0].active


def test_outside_a_request_a_lookup_copies_as_it_is():
    prompt, answer = TOK.encode(SOURCE + "#"), TOK.encode(EDITED)
    drafter, plain = NgramDrafter(), NgramDrafter(rewrites=False)
    for pos in range(len(answer)):  # no begin(): a tool or a test asking for lookups
        assert drafter.propose(prompt + answer[:pos], 16) == plain.propose(prompt + answer[:pos], 16)


def editor(prompt: list[int], answer: list[int]):
    """A target whose greedy answer to `prompt` is `answer`, then EOS (token 0)."""

    def logits(context):
        row = np.zeros(TOK.vocab_size)
        pos = len(context) - len(prompt)
        row[answer[pos] if 0 <= pos < len(answer) else 0] = 20.0
        return row

    return logits


def test_the_engine_writes_the_same_edit_in_fewer_forwards():
    prompt, answer = TOK.encode(SOURCE + "#"), TOK.encode(EDITED)
    results = {}
    for label, drafter in (("plain", NgramDrafter(rewrites=False)), ("rewrites", NgramDrafter())):
        engine = Engine(ToyBackend(logits_fn=editor(prompt, answer), vocab_size=TOK.vocab_size), [drafter])
        results[label] = engine.generate(
            prompt_ids=prompt,
            sampling=SamplingParams(max_tokens=len(answer) + 5),
            speculation=SpeculationConfig(policy="fixed", max_draft_tokens=16),
        )
        assert results[label].token_ids == answer  # exact: a rewrite is only a proposal
    assert results["rewrites"].stats.num_steps < results["plain"].stats.num_steps


def test_the_proposal_after_a_change_goes_on_from_it():
    # After "c = ClearValue" a fresh lookup matches the changed text where it is longest, the
    # answer's own first line ("(1)\nb = "); the proposal that made the change goes on with the file.
    source = "a = Clear(1)\nb = Clear(2)\nc = Clear(3)\nd = Clear(4)\n"
    prompt = TOK.encode("Rename `Clear` to `ClearValue` everywhere.\n" + source + "#")
    text = source.replace("Clear(", "ClearValue(")
    answer = TOK.encode(text)
    before = text.index("Value(3)")  # the third occurrence: the change was seen twice
    proposals = {}
    for rewrites in (True, False):
        drafter = NgramDrafter(rewrites=rewrites)
        drafter.begin(SamplingParams(), SpeculationConfig(), prompt, TOK)
        for pos in range(before):  # the answer so far, proposed at every token
            drafter.propose(prompt + answer[:pos], 8)
        made = drafter.propose(prompt + answer[:before], 8).token_ids
        after = before + len("Value")  # the answer wrote the change as proposed
        proposals[rewrites] = (TOK.decode(made), TOK.decode(drafter.propose(prompt + answer[:after], 8).token_ids))
    assert proposals[True] == ("Value(3)", "(3)\nd = ")
    assert proposals[False][0] == "(3)\nd = " and proposals[False][1] == "(1)\nb = "
