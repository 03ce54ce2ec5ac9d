"""Fill in the middle in the bench: a prompt with a suffix becomes the prompt `/infill` builds
(draftwise.fim, llama.cpp's layout and cuts), and the middle is scored against the removed text:
exact match (trailing whitespace of lines and of the end ignored) and edit similarity (1 - the
Levenshtein distance over the longer length, in characters, as CrossCodeEval's metric)."""

from __future__ import annotations

from draftwise.bench.suites.prompts import Prompt
from draftwise.fim import FimBudget, fim_prompt


def fim_ids(tokenizer, prompt: Prompt) -> list[int]:
    """The prompt ids for a fill-in-the-middle bench prompt (prompt.suffix set): the text before
    the gap is its one turn; cut as /infill cuts it."""
    assert prompt.suffix is not None
    return fim_prompt(tokenizer, prompt.turns[0], prompt.suffix, budget=FimBudget()).ids


def normalise(text: str) -> str:
    """Example: "  x = 1  \\n\\n" -> "  x = 1"."""
    return "\n".join(line.rstrip() for line in text.rstrip().split("\n"))


def levenshtein(a: str, b: str) -> int:
    """Edits (insert, delete, substitute one character) turning a into b. Example: ("kitten",
    "sitting") -> 3."""
    if len(a) < len(b):
        a, b = b, a
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def edit_similarity(middle: str, reference: str) -> float:
    """1.0 for equal texts (after normalise), 0.0 for nothing in common. Example: ("ab", "ac") -> 0.5."""
    a, b = normalise(middle), normalise(reference)
    return 1.0 if not a and not b else 1.0 - levenshtein(a, b) / max(len(a), len(b))


def quality(middle: str, reference: str) -> dict:
    return {
        "exact_match": normalise(middle) == normalise(reference),
        "edit_similarity": round(edit_similarity(middle, reference), 4),
    }
