"""Fill in the middle in the bench: the metrics against reference implementations and literal
cases, the prompt the bench builds (the one /infill builds), and the shipped `fim` suite."""

from __future__ import annotations

import difflib
import functools
import random

import pytest

from draftwise.bench.suites.fim import edit_similarity, fim_ids, levenshtein, normalise, quality
from draftwise.bench.suites.prompts import Prompt, load_suite
from draftwise.fim import FimBudget, fim_prompt


@functools.cache
def levenshtein_reference(a: str, b: str) -> int:
    if not a or not b:
        return len(a) + len(b)
    return min(
        levenshtein_reference(a[1:], b) + 1,
        levenshtein_reference(a, b[1:]) + 1,
        levenshtein_reference(a[1:], b[1:]) + (a[0] != b[0]),
    )


def test_levenshtein_equals_the_recursive_definition():
    rng = random.Random(0)
    for _ in range(300):
        a = "".join(rng.choice("ab c") for _ in range(rng.randint(0, 8)))
        b = "".join(rng.choice("ab c") for _ in range(rng.randint(0, 8)))
        assert levenshtein(a, b) == levenshtein_reference(a, b) == levenshtein(b, a), (a, b)
    assert levenshtein("kitten", "sitting") == 3


@pytest.mark.parametrize(
    "middle, reference, exact, similarity",
    [
        ("    x = 1\n", "    x = 1\n", True, 1.0),
        ("    x = 1", "    x = 1\n\n", True, 1.0),  # trailing whitespace is not judged
        ("    x = 1  \n    y = 2\n", "    x = 1\n    y = 2", True, 1.0),
        ("x = 1\n", "    x = 1\n", False, 5 / 9),  # a wrong indentation is a wrong answer
        ("", "", True, 1.0),
        ("", "abc", False, 0.0),
        ("ab", "ac", False, 0.5),
    ],
)
def test_exact_match_and_edit_similarity(middle, reference, exact, similarity):
    assert quality(middle, reference) == {"exact_match": exact, "edit_similarity": round(similarity, 4)}
    assert edit_similarity(middle, reference) == pytest.approx(similarity)


def test_edit_similarity_orders_answers_as_difflib_does_on_clear_cases():
    reference = "    total += price * quantity\n"
    near, far = "    total += price * qty\n", "    return None\n"
    assert edit_similarity(near, reference) > edit_similarity(far, reference)
    ratio = difflib.SequenceMatcher(None, normalise(near), normalise(reference)).ratio()
    assert ratio > difflib.SequenceMatcher(None, normalise(far), normalise(reference)).ratio()


def test_bench_prompt_is_the_infill_prompt():
    from draftwise.backends.toy import CharTokenizer

    tokenizer = CharTokenizer(100)
    tokenizer.fim_token_ids = lambda: {"prefix": 97, "suffix": 98, "middle": 99}
    prompt = Prompt(1, "fim", ("def f(x):\n" * 100,), reference="    y = x\n", suffix="    return y\n" * 50)
    ids = fim_ids(tokenizer, prompt)
    assert ids == fim_prompt(tokenizer, prompt.turns[0], prompt.suffix, budget=FimBudget()).ids
    assert ids[0] == 97 and ids[-1] == 99 and len(ids) == 1 + 384 + 1 + 126 + 1  # /infill's cuts


def test_the_shipped_fim_suite():
    prompts = load_suite("fim")
    assert len(prompts) >= 24 and len({p.question_id for p in prompts}) == len(prompts)
    for p in prompts:
        assert p.category == "fim" and len(p.turns) == 1 and p.suffix is not None, p.question_id
        assert 1 <= len(p.reference.splitlines()) <= 6 and p.reference.strip(), p.question_id
        assert p.reference.endswith("\n") and p.turns[0].endswith("\n"), p.question_id  # whole lines
        assert len(p.turns[0].splitlines()) <= 256 and len(p.suffix.splitlines()) <= 64, p.question_id
        # the cut is inside a function: what follows is indented as deep as the cut, or closes it
        indent = len(p.reference) - len(p.reference.lstrip())
        assert indent > 0, p.question_id
