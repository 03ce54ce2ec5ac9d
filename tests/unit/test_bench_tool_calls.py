"""The tool_calls bench suite: its prompts, their checks, how an answer is scored, and the runner
decoding a tools prompt under the calls' constraint for every method (toy target that writes a
call in the Hermes format under a template that renders tools)."""

import json
import re

import pytest

from draftwise.backends.toy import ToyBackend
from draftwise.bench.reports.report import render_markdown
from draftwise.bench.suites.prompts import Prompt, PromptFileError, load_suite, parse_lines
from draftwise.bench.suites.tool_calls import plan_for, scores
from draftwise.bench.sweep.runner import BenchConfig, run_bench
from draftwise.drafters import NgramDrafter
from draftwise.engine import Engine
from tests.server.test_tools import TOKENS, TOOLS, VOCAB, scripted


def test_the_suite_covers_the_decisions():
    prompts = load_suite("tool_calls")
    assert len(prompts) >= 12 and all(p.category == "tool_calls" and p.tools for p in prompts)
    for p in prompts:
        names = {t["function"]["name"] for t in p.tools}
        assert p.expected_calls is not None and set(p.expected_calls) <= names, p.question_id
    assert sum(not p.expected_calls for p in prompts) >= 2  # a question no tool fits
    assert sum(len(p.tools) >= 3 and bool(p.expected_calls) for p in prompts) >= 3  # a choice among several
    assert any("both" in p.turns[0] for p in prompts)  # parallel calls
    assert sum(len(p.turns[0]) > 300 for p in prompts) >= 3  # arguments copied from a long context
    assert {json.dumps(p.tool_choice) for p in prompts} >= {"null", '"required"'}
    assert any(isinstance(p.tool_choice, dict) for p in prompts)


@pytest.mark.parametrize(
    "line, why",
    [
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "'tools[0].function.name'"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"expected_calls": ["f"]}, "need 'tools'"),
        ({"tools": TOOLS, "expected_calls": "get_weather"}, "list of function names"),
    ],
)
def test_bad_tool_prompts_are_refused_with_the_line(line, why):
    obj = {"question_id": 1, "category": "tool_calls", "turns": ["x"], **line}
    with pytest.raises(PromptFileError, match=f"f.jsonl:1: .*{re.escape(why)}"):
        parse_lines([json.dumps(obj)], "f.jsonl")


def test_scores_of_answers():
    plan = plan_for(TOKENS, TOOLS, None)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert scores(call, plan, ["get_weather"]) == {
        "tool_calls": ["get_weather"],
        "tool_parse": True,
        "tool_names_exist": True,
        "tool_args_valid": True,
        "tool_decision": True,
    }
    assert scores(call, plan, [])["tool_decision"] is False
    assert scores("It is sunny.", plan, [])["tool_decision"] is True
    long_city = call.replace("Paris", "Paris, France")  # maxLength 8
    assert scores(long_city, plan, ["get_weather"])["tool_args_valid"] is False
    unknown = scores(call.replace("get_weather", "get_moon"), plan, ["get_weather"])
    assert not unknown["tool_names_exist"] and not unknown["tool_args_valid"] and not unknown["tool_decision"]
    assert scores(call[:-5], plan, ["get_weather"])["tool_parse"] is False  # cut short
    block = 'Sure: {"name": "get_time", "arguments": {"zone": "CET"}}'  # auto takes JSON-object calls too
    assert scores(block, plan, ["get_time"])["tool_decision"] is True


def test_the_runner_decodes_tool_prompts_under_the_calls_constraint(tmp_path):
    engine = Engine(ToyBackend(logits_fn=scripted, vocab_size=VOCAB, tokenizer=TOKENS), [NgramDrafter(2, 4)])
    prompts = [
        Prompt(41, "tool_calls", ("call",), tools=TOOLS, expected_calls=("get_weather",)),
        Prompt(42, "tool_calls", ("nothing",), tools=TOOLS, expected_calls=("get_weather",)),
        Prompt(43, "tool_calls", ("nothing",), tools=TOOLS, tool_choice="required", expected_calls=("get_time",)),
    ]
    results = run_bench(engine, prompts, BenchConfig(methods=("baseline", "ngram"), max_tokens=120), tmp_path)
    by_key = {(r["question_id"], r["method"]): r for r in results["records"]}
    for method in ("baseline", "ngram"):
        call, text, required = (by_key[(q, method)] for q in (41, 42, 43))
        assert call["constrained"] and call["tool_calls"] == ["get_weather"] and call["tool_decision"]
        assert text["tool_calls"] == [] and not text["tool_decision"] and text["tool_parse"]
        # required: the toy wants text, the grammar makes it call; whatever it calls validates
        assert required["num_masks"] > 0 and required["tool_calls"] and required["tool_args_valid"]
        assert call["num_prompt_tokens"] > len("call") + 40  # the tools are in the prompt
    assert by_key[(41, "ngram")]["identical_to_baseline"]
    report = render_markdown(results)
    assert "## Tool calls" in report
    assert "| 0 | baseline | 3 | 100% | 100% | 100% |" in report
