"""An agent loop from a maintained library end to end against the server: the openai-agents SDK's
Runner with two function tools, through its chat-completions model over the openai client. The toy
target follows the agent's turn: with no tool result yet it calls get_weather, after one it calls
get_time, after two it answers with both results copied from the prompt (so the answer proves that
the SDK ran each tool with the arguments the server parsed and sent the results back)."""

from __future__ import annotations

import re

import pytest

from draftwise.backends.toy import ToyBackend
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.engine import Engine
from draftwise.types import SpeculationConfig
from tests.server.conftest import MODEL, LiveServer
from tests.server.test_tools import NOISE, TOKENS, VOCAB, HermesToyTokenizer

TURNS = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    'Now the time.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
]


def agent_turn(context):
    """Logits that write TURNS[number of tool results so far], then the answer from the results."""
    text = TOKENS.decode(context)
    if "A>" not in text:
        return NOISE.logits(context)
    prompt, generated = text.rsplit("A>", 1)
    results = re.findall(r"\nt:([^\n]*)", prompt)  # tool messages, as the template renders them
    script = TURNS[len(results)] if len(results) < len(TURNS) else f"It is {results[0]} at {results[1]}."
    row = NOISE.logits(context).copy()
    n = len(generated)
    want = TOKENS.encode(script[n])[0] if n < len(script) and script.startswith(generated) else 0
    row[want] += 20.0
    return row


@pytest.fixture(scope="module")
def agent_server():
    target = ToyBackend(logits_fn=agent_turn, vocab_size=VOCAB, tokenizer=TOKENS, name="toy-agent")
    draft = ToyBackend(logits_fn=agent_turn, vocab_size=VOCAB, tokenizer=HermesToyTokenizer(VOCAB), name="draft")
    engine = Engine(
        target,
        [ModelDrafter(draft, name="draft"), NgramDrafter(2, 4), GrammarDrafter()],
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4),
    )
    with LiveServer(engine) as live:
        yield live


def test_openai_agents_runner_calls_two_tools_and_answers(agent_server):
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(("get_weather", city))
        return "sunny" if city == "Paris" else "unknown"

    @agents.function_tool
    def get_time(zone: str) -> str:
        """The time in a zone."""
        calls.append(("get_time", zone))
        return "noon" if zone == "CET" else "unknown"

    client = AsyncOpenAI(base_url=f"{agent_server.url}/v1", api_key="unused", max_retries=0, timeout=30)
    model = agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    agent = agents.Agent(
        name="helper",
        instructions="Use the tools.",
        tools=[get_weather, get_time],
        model=model,
        model_settings=agents.ModelSettings(temperature=0, max_tokens=200),
    )
    result = agents.Runner.run_sync(agent, "Weather and time in Paris?", max_turns=5)
    assert calls == [("get_weather", "Paris"), ("get_time", "CET")]
    assert result.final_output == "It is sunny at noon."
    items = [type(i).__name__ for i in result.new_items]
    assert items.count("ToolCallItem") == 2 and items.count("ToolCallOutputItem") == 2, items
