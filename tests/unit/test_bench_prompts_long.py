"""The per-prompt max_tokens field and the opt-in `long` suite (issue 41): long contexts shared by
several prompts, long answers, a 40-turn chat. Reads the shipped JSONL only (no model)."""

import json
from importlib import resources

import pytest

from draftwise.bench.suites.prompts import (
    CATEGORIES,
    OPT_IN,
    PromptFileError,
    available_suites,
    load_suite,
    parse_lines,
)

END = "=== end of the documents ==="  # scripts/make_long_suite.py ends every bundle with this line
LONG_CATEGORIES = ("long_rag", "long_code", "long_edit", "long_output", "long_chat")


def shipped_long() -> list[dict]:
    text = (resources.files("draftwise.bench") / "suites" / "long.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_max_tokens_is_kept_and_round_trips():
    (prompt, plain) = parse_lines(
        [
            '{"question_id": 1, "category": "c", "turns": ["a"], "max_tokens": 4096, "source": ["x.py"]}',
            '{"question_id": 2, "category": "c", "turns": ["a"]}',
        ],
        "p.jsonl",
    )
    assert prompt.max_tokens == 4096 and plain.max_tokens is None
    assert prompt.to_dict()["max_tokens"] == 4096 and "max_tokens" not in plain.to_dict()
    assert parse_lines([json.dumps(prompt.to_dict())], "p.jsonl") == [prompt]


@pytest.mark.parametrize("bad", ["0", "-1", '"8"', "1.5", "true", "[64]"])
def test_max_tokens_must_be_a_positive_integer(bad):
    lines = ['{"question_id": 1, "category": "c", "turns": ["a"]}', "", '{"question_id": 2, "category": "c", ']
    lines[2] += f'"turns": ["a"], "max_tokens": {bad}}}'
    with pytest.raises(PromptFileError, match=r"^p\.jsonl:3: 'max_tokens' must be a positive integer, got "):
        parse_lines(lines, "p.jsonl")


def test_long_is_opt_in_but_loadable_and_its_categories_come_last():
    assert "long" in OPT_IN and "long" in available_suites()
    for name in ("full", "quick"):
        assert not {p.category for p in load_suite(name)} & set(LONG_CATEGORIES), name
    long = load_suite("long")
    assert {p.category for p in long} == set(LONG_CATEGORIES)
    assert CATEGORIES[-len(LONG_CATEGORIES) :] == LONG_CATEGORIES
    assert not {p.question_id for p in long} & {p.question_id for p in load_suite("full")}


def test_long_suite_loads_in_file_order_with_its_answer_lengths():
    long = load_suite("long")
    assert [p.question_id for p in long] == [r["question_id"] for r in shipped_long()]
    assert [p.question_id for p in long] == list(range(1101, 1101 + len(long)))
    lengths = {"long_rag": 256, "long_code": 256, "long_edit": 1024, "long_output": 4096, "long_chat": 64}
    assert all(p.max_tokens == lengths[p.category] for p in long)


def test_bundle_prompts_share_their_context_and_sit_together():
    records = shipped_long()
    bundled = [r for r in records if "context_label" in r]
    labels = list(dict.fromkeys(r["context_label"] for r in bundled))
    assert labels == ["8k", "16k", "28k"]
    contexts = {}
    for label in labels:
        group = [i for i, r in enumerate(records) if r.get("context_label") == label]
        assert group == list(range(group[0], group[0] + len(group))), label  # adjacent
        expected = ["long_rag", "long_code"] + (["long_edit"] if label != "8k" else [])
        assert [records[i]["category"] for i in group] == expected, label
        parts = [records[i]["turns"][0].split(END + "\n\n") for i in group]
        assert all(len(p) == 2 and p[1].strip() for p in parts), label  # the bundle, then a task
        assert len({p[0] for p in parts}) == 1, label  # one bundle text, character for character
        assert len({p[1] for p in parts}) == len(parts), label
        contexts[label] = parts[0][0]
    # about 4-5 characters a token: 8k < 16k < 28k, each a few whole files in code blocks
    assert 24_000 < len(contexts["8k"]) < len(contexts["16k"]) < len(contexts["28k"]) < 150_000
    for label, context in contexts.items():
        assert context.count("\n```python\n") >= 3 and "Document 1 of" in context, label


def test_long_suite_records_have_their_sources_and_shapes():
    records = shipped_long()
    counts = {c: sum(r["category"] == c for r in records) for c in LONG_CATEGORIES}
    assert counts == {"long_rag": 3, "long_code": 3, "long_edit": 2, "long_output": 2, "long_chat": 1}
    for r in records:
        assert r["source"] and r["licence"], r["question_id"]
        assert "prediction" not in r, r["question_id"]
    edits = [r for r in records if r["category"] == "long_edit"]
    assert [r["context_label"] for r in edits] == ["16k", "28k"]
    for r in edits:
        assert r["reference"].startswith("```python\n") and r["reference"].endswith("\n```")
        assert r["reference"].count("\n") >= 30 and "whole updated function" in r["turns"][0]
    (chat,) = [r for r in records if r["category"] == "long_chat"]
    assert len(chat["turns"]) == 40 and len(set(chat["turns"])) == 40
    outputs = [r["turns"][0] for r in records if r["category"] == "long_output"]
    assert any("unchanged" in t and len(t) > 12_000 for t in outputs)  # a copy of a ~4,500-token file
    assert any("3,500 words" in t and len(t) < 2_000 for t in outputs)  # a long answer with little to copy
