"""Each tool-call format through the server (OpenAI's `tools` and Ollama's), exact under
speculation: test_tools' scripted toy, under a chat template of each format (Llama 3.x JSON,
Mistral's [TOOL_CALLS], and one that lays out no tools: plain JSON, the tools described in a
system message), writes its calls; an engine that speculates (a draft model, n-grams, the
grammar's forced tokens, the calls drafter) must answer exactly as one that does not, and every
call must parse and validate against its tool's schema."""

from __future__ import annotations

import json

import httpx
import jinja2
import jsonschema
import pytest

from draftwise.backends.toy import CharTokenizer, ToyBackend, ToyModel
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.calls import CallsDrafter
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.engine import Engine
from draftwise.types import SpeculationConfig
from tests.server.conftest import MODEL, LiveServer
from tests.server.test_tools import TOOLS

VOCAB = 90
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
TURNS = (
    "{% for m in messages %}{{ m.role[0] }}:{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}{CALL}{% endfor %}\n{% endfor %}"
    "{% if add_generation_prompt %}A>{% endif %}"
)
FORMATS = {
    # template (with the marker that names its format), the calls the toy writes
    "llama3_json": (
        "{% if tools %}tools: {{ tools | length }}<|start_header_id|>ipython<|end_header_id|>\n{% endif %}"
        + TURNS.replace(
            "{CALL}", '{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}'
        ),
        'Let me see. {"name": "get_weather", "parameters": {"city": "Paris"}}',
        ["get_weather"],
    ),
    "mistral": (
        "{% if tools %}[AVAILABLE_TOOLS]{{ tools | length }}[/AVAILABLE_TOOLS]\n{% endif %}"
        + TURNS.replace("{CALL}", "[TOOL_CALLS]{{ c.function.name }}"),
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {"zone": "CET"}}]',
        ["get_weather", "get_time"],
    ),
    "json": (
        TURNS.replace("{CALL}", ""),  # no tools: they come in a system message
        'Sure: {"name": "get_time", "arguments": {"zone": "CET"}}',
        ["get_time"],
    ),
}


def _tokenizer(template: str) -> CharTokenizer:
    class Tok(CharTokenizer):
        chat_template = template

        def apply_chat_template(self, messages, *, add_generation_prompt=True, tools=None):
            env = jinja2.Environment()
            env.filters["tojson"] = json.dumps
            return env.from_string(template).render(
                messages=messages, tools=tools, add_generation_prompt=add_generation_prompt
            )

    return Tok(VOCAB)


TEXT = CharTokenizer(VOCAB)
NOISE = ToyModel(vocab_size=VOCAB, sharpness=1.0)


def scripted(script: str):
    """Logits that write `script` when the last user message says "call" (else "Done."), with
    small noise elsewhere (so a grammar that forbids the script's token picks another)."""

    def logits(context):
        text = TEXT.decode(context)
        if "A>" not in text:
            return NOISE.logits(context)
        prompt, generated = text.rsplit("A>", 1)
        last = prompt.rstrip("\n").rsplit("\n", 1)[-1]
        want_text = script if last.startswith("u:call") else "Done."
        row = NOISE.logits(context).copy()
        n = len(generated)
        ok = n < len(want_text) and want_text.startswith(generated)
        row[TEXT.encode(want_text[n])[0] if ok else 0] += 20.0
        return row

    return logits


def make_engine(fmt: str, speculate: bool) -> Engine:
    template, script, _ = FORMATS[fmt]
    target = ToyBackend(logits_fn=scripted(script), vocab_size=VOCAB, tokenizer=_tokenizer(template), name="t")
    drafters = []
    if speculate:
        draft = ToyBackend(logits_fn=scripted(script), vocab_size=VOCAB, tokenizer=_tokenizer(template), name="d")
        drafters = [ModelDrafter(draft, name="draft"), NgramDrafter(2, 4), GrammarDrafter(), CallsDrafter()]
    config = SpeculationConfig(policy="fixed", max_draft_tokens=4, enabled=speculate)
    return Engine(target, drafters, speculation=config)


@pytest.fixture(scope="module", params=sorted(FORMATS))
def servers(request):
    with LiveServer(make_engine(request.param, True)) as spec, LiveServer(make_engine(request.param, False)) as plain:
        yield request.param, spec, plain


def _openai(live, **body) -> dict:
    body = {"model": MODEL, "tools": TOOLS, "temperature": 0, "max_tokens": 200, **body}
    reply = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]


def _validated(calls: list[tuple[str, dict]]) -> list[str]:
    for name, arguments in calls:
        jsonschema.validate(arguments, SCHEMAS[name])
    return [name for name, _ in calls]


@pytest.mark.parametrize(
    "choice", ["auto", "required", {"type": "function", "function": {"name": "get_time"}}], ids=str
)
def test_openai_calls_are_the_same_with_and_without_speculation(servers, choice):
    fmt, spec, plain = servers
    messages = [{"role": "user", "content": "call"}]
    answers = [_openai(live, messages=messages, tool_choice=choice) for live in (spec, plain)]
    for answer in answers:
        for call in answer["message"].get("tool_calls") or []:
            call["id"] = "-"
    assert answers[0] == answers[1]
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in answers[0]["message"]["tool_calls"]
    ]
    names = _validated(calls)
    assert answers[0]["finish_reason"] == "tool_calls"
    if choice == "auto":
        assert names == FORMATS[fmt][2]  # the toy's own calls
    elif isinstance(choice, dict):
        assert names == ["get_time"]


def test_a_text_answer_and_a_tool_result_turn(servers):
    fmt, spec, plain = servers
    text = _openai(spec, messages=[{"role": "user", "content": "hello"}])
    assert text["message"]["content"] == "Done." and not text["message"].get("tool_calls")
    call = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}
    turn = [
        {"role": "user", "content": "call"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]
    answers = [_openai(live, messages=turn) for live in (spec, plain)]
    assert answers[0] == answers[1] and answers[0]["message"]["content"] == "Done."


def test_ollama_tools_are_the_same_with_and_without_speculation(servers):
    fmt, spec, plain = servers
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "call"}],
        "tools": TOOLS,
        "stream": False,
        "options": {"temperature": 0, "num_predict": 200},
    }
    answers = [httpx.post(f"{live.url}/api/chat", json=body, timeout=60).json() for live in (spec, plain)]
    messages = [a["message"] for a in answers]
    for message in messages:
        for call in message.get("tool_calls") or []:
            call["id"] = "-"
    assert messages[0] == messages[1], answers
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in messages[0]["tool_calls"]]
    assert _validated(calls) == FORMATS[fmt][2]
    metrics = httpx.get(f"{spec.url}/metrics").text.splitlines()
    accepted = next(line for line in metrics if line.startswith("draftwise_accepted_tokens_total"))
    assert float(accepted.split()[-1]) > 20  # the drafts were taken: the equality above was tested
