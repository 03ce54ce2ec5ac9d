"""The calls drafter (drafters/calls.py): the skeleton of a ```json call block proposed from the
tools, the values left to the model; and the same answers, greedy, with it and without it."""

import pytest

from draftwise.backends.hf_tokenizers import ByteTokenizer
from draftwise.backends.toy import ToyBackend
from draftwise.drafters.calls import CallsDrafter, InValue, align
from draftwise.drafters.calls import _split as split
from draftwise.engine import Engine
from draftwise.tools import ToolChoice, parse_tools
from draftwise.tools.formats import json_block
from draftwise.types import CALL_ANY, CALL_HOLE, Constraint, SamplingParams, SpeculationConfig

TOOLS = parse_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string"},
                        "days": {"type": "integer"},
                        "unit": {"enum": ["celsius", "fahrenheit"]},
                    },
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "get_time",
                "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
            },
        },
    ]
)
# The default target's own block for "Weather in Lisbon for 3 days, in celsius?"
BLOCK = (
    '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Lisbon",\n    "days": 3,\n'
    '    "unit": "celsius"\n  }\n}\n```'
)


def drafter(tools=TOOLS):
    d = CallsDrafter(tokenizer=ByteTokenizer(257, [256]))
    constraint = Constraint("text", "", "<tool_call>", calls=json_block.calls(tools, ToolChoice("auto")))
    d.begin(SamplingParams(constraint=constraint), SpeculationConfig())
    return d


def proposed(answer: str, prompt: str = "Hi") -> str:
    """What a drafter proposes after `answer` (shown token by token, as a request's steps do)."""
    d = drafter()
    start = len(ByteTokenizer(257).encode(prompt))
    ids = ByteTokenizer(257).encode(prompt + answer)
    for end in range(start, len(ids)):
        d.propose(ids[:end], 64)
    return ByteTokenizer(257).decode(list(d.propose(ids, 64).token_ids))


def test_the_templates_are_the_blocks_the_model_writes():
    calls = json_block.calls(TOOLS, ToolChoice("auto"))
    assert len(calls) == 8  # 2 tools x fenced or bare x indent 2 or 4, the model's style first
    assert calls[0] == BLOCK.replace("Lisbon", CALL_HOLE).replace("3", CALL_ANY).replace("celsius", CALL_HOLE)
    named = json_block.calls(TOOLS, ToolChoice("named", "get_time"))
    assert all('"get_time"' in t for t in named) and len(named) == 4


def test_align_skips_values_and_stops_at_the_next_one():
    t = split('{"a": "' + CALL_HOLE + '", "n": ' + CALL_ANY + "}")
    assert align(t, "") == '{"a": "'
    assert align(t, '{"a') == '": "'
    assert align(t, '{"a": "x \\" y') == InValue('x \\" y', '", "n": ')  # an escaped quote ends nothing
    assert align(t, '{"a": "x \\" y"') == ', "n": '
    assert align(t, '{"a": "x", "n": 12') == ""
    assert align(t, '{"a": "x", "n": 12} ok') == 19  # complete: its length
    assert align(t, '{"b') is None


def test_it_proposes_the_skeleton_and_never_a_value():
    assert proposed("") == ""  # the answer's start: it may be text (a miss costs a long forward)
    assert proposed("``") == '`json\n{\n  "name": "get_'  # the tools agree up to here
    assert proposed('```json\n{\n  "name": "get_w') == 'eather",\n  "arguments": {\n    "city": "'
    assert proposed(BLOCK[: BLOCK.index("Lis") + 3]) == ""  # a value the prompt does not hold is the model's
    assert proposed(BLOCK[: BLOCK.index("3,") + 1]) == ""  # 3 or 30 ...
    assert proposed(BLOCK[: BLOCK.index("3,") + 2]) == '\n    "unit": "'
    assert proposed(BLOCK[: BLOCK.index("celsius") + 7]) == ""  # "celsius" or "celsius2"...
    assert proposed(BLOCK[: BLOCK.index("celsius") + 8]) == "\n  }\n}\n```"
    assert proposed(BLOCK) == ""
    # Text first, then a bare call with a 4-space indent.
    assert proposed('Sure.\n{\n    "name": "get_t') == 'ime",\n    "arguments": {\n        "zone": "'
    assert proposed("Sure, no tool is needed: {x}") == ""  # a brace that starts no call


def test_inside_a_value_the_prompt_holds_it_proposes_the_rest_and_the_skeleton_after():
    prompt = "What is the weather in Lisbon, for 3 days? And in Porto?"
    at = BLOCK.index("Lis")
    assert proposed(BLOCK[:at], prompt) == ""  # an empty value: which one is the model's
    assert proposed(BLOCK[: at + 1], prompt) == 'isbon",\n    "days": '  # up to the next value
    assert proposed(BLOCK[: at + 6], prompt) == '",\n    "days": '  # complete as the prompt has it
    # A value with a space so far runs to the quote or the line's end; trailing punctuation is not
    # the value's.
    assert proposed(BLOCK[:at] + "Lisbon, for", prompt) == ' 3 days? And in Porto",\n    "days": '
    assert proposed(BLOCK[:at] + "Lisbox", prompt) == ""


def test_without_calls_in_the_constraint_it_proposes_nothing():
    d = CallsDrafter(tokenizer=ByteTokenizer(257, [256]))
    d.begin(SamplingParams(), SpeculationConfig())
    assert len(d.propose([1, 2, 96, 96, 96], 8)) == 0
    d.begin(SamplingParams(constraint=Constraint.json_object()), SpeculationConfig())
    assert len(d.propose([1, 2, 96, 96, 96], 8)) == 0


@pytest.mark.parametrize("policy", ["auto", "fixed"])
def test_greedy_answers_are_the_same_with_the_calls_drafter(policy):
    """A byte-level model that writes the block (and then EOS) under the tools' lazy constraint:
    the same answer with the drafter as without, in fewer target forwards."""
    from draftwise.tools import tool_plan

    text = BLOCK
    tokenizer = ByteTokenizer(257, [256])
    tokenizer.chat_template = "{{ tools }} <tool_call>"
    target_ids = tokenizer.encode(text) + [256]

    def logits(context):
        import numpy as np

        row = np.full(257, -5.0)
        n = len(context) - 4  # four prompt tokens
        row[target_ids[min(n, len(target_ids) - 1)] if n >= 0 else 256] = 5.0
        return row

    plan = tool_plan(tokenizer, TOOLS, ToolChoice("auto"))
    results = {}
    for with_calls in (False, True):
        backend = ToyBackend(logits_fn=logits, vocab_size=257, name="blocks", tokenizer=tokenizer)
        drafters = [CallsDrafter()] if with_calls else []
        engine = Engine(backend, drafters, speculation=SpeculationConfig(policy=policy, max_draft_tokens=16))
        results[with_calls] = engine.generate(
            prompt_ids=[1, 2, 3, 4],
            sampling=SamplingParams(max_tokens=200, constraint=plan.constraint),
            speculation=SpeculationConfig(policy=policy, max_draft_tokens=16, enabled=with_calls),
        )
    plain, drafted = results[False], results[True]
    assert drafted.text == plain.text == text
    assert drafted.stats.num_steps < plain.stats.num_steps / 2
