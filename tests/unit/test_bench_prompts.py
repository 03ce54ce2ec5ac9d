"""Prompt files and shipped suites: validation errors name FILE:LINE; suites meet the issue's spec."""

import json
import re

import pytest

from draftwise.backends.toy import CharTokenizer
from draftwise.bench.suites.prompts import (
    CATEGORIES,
    Prompt,
    PromptFileError,
    filler_for,
    filter_categories,
    load_prompts,
    load_suite,
    pad_prompt,
)
from draftwise.types import ConfigError

GOOD = {"question_id": 1, "category": "math", "turns": ["What is 2 + 2?"]}


def write_lines(tmp_path, lines):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_valid_file_loads_with_reference_and_blank_lines(tmp_path):
    path = write_lines(
        tmp_path,
        [json.dumps(GOOD), "", json.dumps({**GOOD, "question_id": 2, "turns": ["a", "b"], "reference": ["4"]})],
    )
    prompts = load_prompts(path)
    assert [p.question_id for p in prompts] == [1, 2]
    assert prompts[1].turns == ("a", "b") and prompts[1].reference == ["4"]


@pytest.mark.parametrize(
    "bad, why",
    [
        ('{"question_id": 3, "category": "math", "turns": ["x"]', "not valid JSON"),
        (json.dumps({"category": "math", "turns": ["x"]}), "'question_id' must be an integer"),
        (json.dumps({**GOOD, "question_id": "7"}), "'question_id' must be an integer"),
        (json.dumps({**GOOD, "question_id": True}), "'question_id' must be an integer"),
        (json.dumps({**GOOD, "category": ""}), "'category' must be a non-empty string"),
        (json.dumps({**GOOD, "turns": "just a string"}), "'turns' must be a non-empty list"),
        (json.dumps({**GOOD, "turns": []}), "'turns' must be a non-empty list"),
        (json.dumps({**GOOD, "turns": ["ok", 5]}), "'turns'[1] must be a non-empty string"),
        (json.dumps([1, 2]), "expected a JSON object"),
        (json.dumps(GOOD), "question_id 1 already used on line 1"),
        (json.dumps({**GOOD, "max_tokens": 0}), "'max_tokens' must be a positive integer, got 0"),
        (json.dumps({**GOOD, "max_tokens": -5}), "'max_tokens' must be a positive integer, got -5"),
        (json.dumps({**GOOD, "max_tokens": "64"}), "'max_tokens' must be a positive integer, got '64'"),
        (json.dumps({**GOOD, "max_tokens": 2.5}), "'max_tokens' must be a positive integer, got 2.5"),
        (json.dumps({**GOOD, "max_tokens": True}), "'max_tokens' must be a positive integer, got True"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad, why):
    path = write_lines(tmp_path, [json.dumps(GOOD), "", bad])
    with pytest.raises(PromptFileError) as info:
        load_prompts(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: "), message
    assert why in message


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_prompts(tmp_path / "nope.jsonl")
    empty = write_lines(tmp_path, [""])
    with pytest.raises(PromptFileError, match="no prompts"):
        load_prompts(empty)


def regular_categories() -> list[str]:
    """CATEGORIES less those only the opt-in `long` suite holds."""
    opt_in = {p.category for p in load_suite("long")}
    return [c for c in CATEGORIES if c not in opt_in]


def test_full_suite_has_every_category_with_ten_or_more_unique_prompts():
    prompts = load_suite("full")
    assert len({p.question_id for p in prompts}) == len(prompts)
    counts = {c: sum(p.category == c for p in prompts) for c in regular_categories()}
    assert all(n >= 10 for n in counts.values()), counts
    assert {p.category for p in prompts} == set(regular_categories())


def test_quick_suite_takes_two_per_category_from_full():
    quick, full = load_suite("quick"), load_suite("full")
    assert len(quick) == 2 * len(regular_categories())
    assert all(sum(p.category == c for p in quick) == 2 for c in regular_categories())
    assert set(quick) <= set(full)


def test_suites_meet_the_category_definitions():
    prompts = load_suite("full")
    for p in prompts:
        if p.category == "code_edit":
            blocks = re.findall(r"```[a-z]*\n(.*?)```", p.turns[0], re.S)
            assert len(blocks) == 1, p.question_id
            assert 30 <= len(blocks[0].strip().splitlines()) <= 80, p.question_id
        if p.category == "summarization":
            passage = p.turns[0].split("\n\n", 1)[1]
            assert len(passage.split()) >= 300, p.question_id
        if p.category == "code_edit_long":
            blocks = re.findall(r"```[a-z]*\n(.*?)```", p.turns[0], re.S)
            assert len(blocks) == 1 and 60 <= len(blocks[0].splitlines()) <= 200, p.question_id
            assert p.prediction_for(0) == f"```{p.turns[0].split('```')[1]}```", p.question_id  # the original file
        if p.category == "multi_turn":
            assert len(p.turns) == 2, p.question_id
        elif p.category != "code_edit_long":  # it has a few multi-round edits of one file
            assert len(p.turns) == 1, p.question_id


def test_unknown_suite_and_category_are_config_errors():
    with pytest.raises(ConfigError, match="unknown suite 'nope'.*quick"):
        load_suite("nope")
    with pytest.raises(ConfigError, match="no prompts in categories \\['poetry'\\]"):
        filter_categories(load_suite("quick"), ["poetry"])
    assert {p.category for p in filter_categories(load_suite("quick"), ["rag", "math"])} == {"rag", "math"}


def test_pad_prompt_reaches_about_the_requested_length_with_filler_from_other_prompts():
    tok = CharTokenizer(90)
    pool = load_suite("quick")
    prompt = Prompt(1, "math", ("How much is seven times six?", "And times seven?"))
    filler = filler_for(prompt, pool)
    assert prompt.turns[0] not in filler
    padded = pad_prompt(prompt, 1000, filler, lambda t: tok.encode(t, add_special=False), tok.decode)
    assert padded.turns[0].endswith(prompt.turns[0]) and padded.turns[1] == prompt.turns[1]
    assert 990 <= len(tok.encode(padded.turns[0])) <= 1000
    assert pad_prompt(prompt, 16, filler, tok.encode, tok.decode) == prompt  # already long enough


def test_predictions_per_turn_are_parsed_and_checked():
    from draftwise.bench.suites.prompts import PromptFileError, parse_lines

    one, many = parse_lines(
        [
            '{"question_id": 1, "category": "code_edit", "turns": ["a", "b"], "prediction": "x"}',
            '{"question_id": 2, "category": "code_edit", "turns": ["a", "b"], "prediction": [null, "y"]}',
        ],
        "p.jsonl",
    )
    assert (one.prediction_for(0), one.prediction_for(1)) == ("x", None)
    assert (many.prediction_for(0), many.prediction_for(1)) == (None, "y")
    for bad in ('"prediction": 5', '"prediction": ["a", "b", "c"]', '"prediction": [1]'):
        with pytest.raises(PromptFileError, match="prediction"):
            parse_lines(['{"question_id": 1, "category": "c", "turns": ["a", "b"], ' + bad + "}"], "p.jsonl")


def test_the_shipped_edit_and_schema_suites():
    edits, schemas = load_suite("code_edit_long"), load_suite("structured_schema")
    assert len(edits) >= 10 and all(p.prediction_for(0) for p in edits)
    assert sum(len(p.turns) > 1 for p in edits) >= 2
    assert len(schemas) >= 10 and all(isinstance(p.json_schema, dict) for p in schemas)


def test_fill_in_the_middle_prompts_take_a_suffix():
    from draftwise.bench.suites.prompts import parse_lines

    line = '{"question_id": 1, "category": "fim", "turns": ["def f(x):\\n"], "suffix": "    return y\\n", '
    (prompt,) = parse_lines([line + '"reference": "    y = x\\n"}'], "p.jsonl")
    assert prompt.suffix == "    return y\n" and prompt.reference == "    y = x\n"
    assert parse_lines([json.dumps(prompt.to_dict())], "p.jsonl") == [prompt]
    for bad in (
        '{"question_id": 1, "category": "fim", "turns": ["a", "b"], "suffix": "c"}',
        '{"question_id": 1, "category": "fim", "turns": ["a"], "suffix": 3}',
        '{"question_id": 1, "category": "fim", "turns": ["a"], "suffix": "c", "json_schema": {"type": "object"}}',
    ):
        with pytest.raises(PromptFileError, match="p.jsonl:1: 'suffix'"):
            parse_lines([bad], "p.jsonl")
