"""Each tool-call format on llama.cpp, exact under speculation: tiny GGUF models whose chat
templates (or, without one, vocabularies) name Hermes, Llama 3.x JSON, Mistral's [TOOL_CALLS] or
no format (plain JSON, the tools described in a system message). Under tool_choice required and
a named tool the grammar makes the random model write calls; greedy decoding with a draft model
of the same vocabulary, n-grams, the grammar's forced tokens and the calls drafter must equal
greedy decoding without them, and every call must parse and validate. Under auto the answer is
the same text either way."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.calls import CallsDrafter
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.engine import Engine
from draftwise.tools import ToolChoice, parse_tools, tool_plan
from draftwise.types import SamplingParams, SpeculationConfig
from tiny_gguf import write_tiny_gguf

TOOLS_JSON = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "strict": True,  # no keys beside these (a random model would write some)
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "enum": ["Paris", "Lisbon"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["city", "days"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"utc": {"type": "boolean"}},
                "required": ["utc"],
                "additionalProperties": False,
            },
        },
    },
]
TOOLS = parse_tools(TOOLS_JSON)
SCHEMAS = {t.name: t.parameters for t in TOOLS}
CHATML = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "Call as <tool_call>{...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{% for m in messages %}{% set role = 'ipython' if m.role == 'tool' else m.role %}"
    "<|start_header_id|>{{ role }}<|end_header_id|>\n\n{{ m.content }}"
    "{% if tools and loop.last %}{{ tools | tojson }}{% endif %}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
MISTRAL = (
    "{% for m in messages %}{% if m.role == 'user' %}{% if tools and loop.last %}[AVAILABLE_TOOLS]"
    "{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]"
    "{% else %}{{ m.content }}{% for c in m.tool_calls or [] %}[TOOL_CALLS]{% endfor %}</s>{% endif %}{% endfor %}"
)
LLAMA3_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>")
MODELS = {
    # format: (chat template, special tokens, end-of-turn token)
    "hermes": (CHATML, ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"), "<|im_end|>"),
    "llama3_json": (LLAMA3, LLAMA3_TOKENS, "<|eot_id|>"),
    "mistral": (MISTRAL, ("[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"), None),
    "llama3_json by family": (None, LLAMA3_TOKENS, "<|eot_id|>"),  # llama.cpp's built-in llama3 template
    "json": (None, ("<start_of_turn>", "<end_of_turn>"), "<end_of_turn>"),  # gemma's built-in: no format
}
CHOICES = [ToolChoice("required"), ToolChoice("named", "get_time"), ToolChoice("auto")]


@pytest.fixture(scope="module", params=sorted(MODELS))
def pair(request, tmp_path_factory):
    """(format, target, draft): two tiny models of one vocabulary, the draft another seed."""
    from draftwise.backends.llamacpp import LlamaCppBackend

    template, tokens, eot = MODELS[request.param]
    folder = tmp_path_factory.mktemp("formats")
    backends = []
    for seed, role in ((0, "target"), (7, "draft")):
        path = write_tiny_gguf(
            folder / f"{role}.gguf", seed=seed, chat_template=template, special_tokens=tokens, eot_token=eot
        )
        backends.append(LlamaCppBackend(path, n_ctx=2048, n_threads=1, name=role))
    yield request.param.split()[0], *backends
    for backend in backends:
        backend.close()


def _engine(target, draft) -> Engine:
    drafters = [ModelDrafter(draft, name="draft"), NgramDrafter(2, 4), GrammarDrafter(), CallsDrafter()]
    return Engine(target, drafters, speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4))


def _ask(engine, plan, speculate: bool):
    messages = plan.messages([{"role": "user", "content": "What is the weather in Paris?"}])
    prompt = engine.encode_prompt(None, messages, [t.as_openai() for t in TOOLS])
    sampling = SamplingParams(max_tokens=96, constraint=plan.constraint)
    speculation = SpeculationConfig(policy="fixed", max_draft_tokens=4, enabled=speculate)
    return engine.generate(prompt_ids=prompt, sampling=sampling, speculation=speculation)


@pytest.mark.parametrize("choice", CHOICES, ids=lambda c: c.name or c.mode)
def test_calls_are_exact_under_speculation_and_validate(pair, choice):
    fmt, target, draft = pair
    engine = _engine(target, draft)
    plan = tool_plan(target.tokenizer, TOOLS, choice, parallel=False)
    assert plan.format.name == fmt
    spec, plain = _ask(engine, plan, True), _ask(engine, plan, False)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.num_drafted > 0  # it drafted: the equality was tested
    parsed = plan.parse(plain.text)
    if choice.mode == "auto":
        return  # a random model writes text (the same either way)
    assert parsed.calls, plain.text
    for call in parsed.calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    if choice.mode == "named":
        assert [c.name for c in parsed.calls] == ["get_time"]


def test_through_the_server(pair):
    """OpenAI's tools and Ollama's on the same model: the named call validates."""
    from draftwise.server import create_app
    from tests.server.conftest import LiveServer

    fmt, target, draft = pair
    engine = _engine(target, draft)
    with LiveServer(engine, app=create_app(engine, "tiny")) as live:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "The time?"}],
            "tools": TOOLS_JSON,
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
            "temperature": 0,
            "max_tokens": 96,
        }
        reply = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        (call,) = reply.json()["choices"][0]["message"]["tool_calls"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS["get_time"])
        body = {k: body[k] for k in ("model", "messages", "tools")}
        reply = httpx.post(f"{live.url}/api/chat", json={**body, "stream": False, "options": {"num_predict": 8}})
        assert reply.status_code == 200, reply.text  # auto: text from a random model, but answered
