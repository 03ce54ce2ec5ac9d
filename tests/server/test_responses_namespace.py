"""Namespace tools on /v1/responses (Codex CLI groups its sub-agent tools in one): the model sees
each inner function as "{namespace}__{name}", a call of one comes back as a function_call item
with `name` and `namespace` apart, and a function_call input item with a namespace goes back to
the qualified name; a namespace holding anything but function tools is a 400 naming it."""

from __future__ import annotations

import openai
import pytest

from draftwise.server.responses_answers import call_item
from draftwise.server.responses_translate import function_tools, input_messages
from tests.server.conftest import MODEL, LiveServer
from tests.server.test_tools import make_engine

NAMESPACE = {
    "type": "namespace",
    "name": "agents",
    "description": "Sub-agents.",
    "tools": [{"type": "function", "name": "spawn", "description": "Start one.", "parameters": {"type": "object"}}],
}


def test_a_namespace_is_flattened_and_its_calls_split_back():
    tools = function_tools([{"type": "function", "name": "f", "parameters": {"type": "object"}}, NAMESPACE])
    assert [t["function"]["name"] for t in tools] == ["f", "agents__spawn"]
    assert tools[1]["function"]["description"] == "Sub-agents. Start one."
    item = call_item("call_1", "agents__spawn", "{}", namespaces=frozenset({"agents"}))
    assert (item["name"], item["namespace"]) == ("spawn", "agents")
    assert "namespace" not in call_item("call_2", "other__x", "{}", namespaces=frozenset({"agents"}))
    messages = input_messages(
        [{"type": "function_call", "call_id": "c1", "name": "spawn", "namespace": "agents", "arguments": "{}"}]
    )
    assert messages[0]["tool_calls"][0]["function"]["name"] == "agents__spawn"


@pytest.fixture(scope="module")
def live():
    with LiveServer(make_engine()) as server:
        yield server


def test_a_request_with_a_namespace_is_served_and_a_bad_one_refused(live):
    c = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=30)
    answer = c.responses.create(model=MODEL, input="abc", tools=[NAMESPACE], max_output_tokens=8, temperature=0)
    assert answer.status in ("completed", "incomplete")
    bad = {**NAMESPACE, "tools": [{"type": "web_search"}]}
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model=MODEL, input="abc", tools=[bad], max_output_tokens=8)
    assert err.value.body["param"] == "tools[0].tools[0].type"
