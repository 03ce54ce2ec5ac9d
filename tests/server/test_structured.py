"""Structured output through the server: OpenAI's response_format (json_object, json_schema)
and the grammar / regex extensions, streaming and not, with the openai client; bad schemas
are a 400 with the library's message, and the request after a failed one is unconstrained.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.constraints import Constraint
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.engine import Engine
from draftwise.types import SamplingParams, SpeculationConfig
from tests.server.conftest import MODEL
from tests.server.test_server import client

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "a record please"}]


def make_engine() -> Engine:
    target = ToyModel(vocab_size=90, sharpness=3)  # the whole toy alphabet: JSON punctuation included
    draft = ToyBackend(ToyModel(vocab_size=90, sharpness=2.5), name="toy-draft")
    return Engine(
        ToyBackend(target),
        [ModelDrafter(draft, name="draft"), NgramDrafter(2, 4), GrammarDrafter()],
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4),
    )


def reference(constraint: Constraint | None, max_tokens: int = 60) -> str:
    return (
        make_engine()
        .generate(messages=MESSAGES, sampling=SamplingParams(max_tokens=max_tokens, constraint=constraint))
        .text
    )


@pytest.fixture(scope="module")
def structured_server():
    from tests.server.conftest import LiveServer

    with LiveServer(make_engine()) as live:
        yield live


def json_schema_format(schema=SCHEMA) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "record", "schema": schema, "strict": True}}


def test_json_schema_non_streaming(structured_server):
    resp = client(structured_server.url).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=60, temperature=0, response_format=json_schema_format()
    )
    content = resp.choices[0].message.content
    jsonschema.validate(json.loads(content), SCHEMA)
    assert content == reference(Constraint.json_schema(SCHEMA))
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.model_extra["speculative"]["num_forced_tokens"] > 0


def test_json_schema_streaming_under_sampling(structured_server):
    stream = client(structured_server.url).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=60,
        temperature=1.0,
        seed=3,
        stream=True,
        response_format=json_schema_format(),
    )
    content = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(content), SCHEMA)


def test_json_object_and_the_extensions(structured_server):
    c = client(structured_server.url)
    resp = c.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=40, temperature=0, response_format={"type": "json_object"}
    )
    # The random toy model writes one endless key; the constrained reference writes the same.
    assert resp.choices[0].message.content == reference(Constraint.json_object(), max_tokens=40)
    assert resp.choices[0].message.content.startswith('{"')
    resp = c.completions.create(
        model=MODEL, prompt="pick", max_tokens=20, temperature=0, extra_body={"regex": "(yes|no), [a-z]{3}"}
    )
    assert re.fullmatch("(yes|no), [a-z]{3}", resp.choices[0].text)
    resp = c.completions.create(
        model=MODEL, prompt="pick", max_tokens=20, temperature=0, extra_body={"grammar": 'root ::= "x" [0-9] [0-9]?'}
    )  # GBNF
    assert re.fullmatch("x[0-9]{1,2}", resp.choices[0].text)


@pytest.mark.parametrize(
    "body, message",
    [
        ({"response_format": json_schema_format({"type": 5})}, "type must be a string"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "needs json_schema.schema"),
        ({"extra_body": {"regex": "[a-"}}, "unclosed character class"),
        ({"extra_body": {"grammar": "start: missing"}}, "missing"),
        ({"response_format": {"type": "json_object"}, "extra_body": {"regex": "a"}}, "give one of"),
    ],
)
def test_bad_constraints_are_400_and_the_next_request_is_unconstrained(structured_server, body, message):
    c = client(structured_server.url)
    with pytest.raises(openai.BadRequestError, match=message):
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0, **body)
    resp = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=30, temperature=0)
    assert resp.choices[0].message.content == reference(None, max_tokens=30)


def test_unknown_response_format_type_is_rejected(structured_server):
    with pytest.raises(openai.APIStatusError) as info:
        client(structured_server.url).chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=5, response_format={"type": "yaml"}
        )
    assert info.value.status_code in (400, 422) and "response_format" in str(info.value)


# ---------------------------------------------------------------------- predicted outputs
def test_prediction_through_the_openai_client(start_server):
    from draftwise.drafters.prediction import PredictionDrafter

    target = ToyModel(vocab_size=40, sharpness=3)
    engine = Engine(
        ToyBackend(target),
        [PredictionDrafter(), NgramDrafter(2, 4)],
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=8),
    )
    live = start_server(engine)
    c = client(live.url)
    plain = c.completions.create(
        model=MODEL, prompt="the cat", max_tokens=40, temperature=0, extra_body={"speculation": {"enabled": False}}
    )
    expected = plain.choices[0].text
    assert plain.usage.completion_tokens_details is None  # no prediction, no details
    edited = expected[:15] + "zz" + expected[17:]
    for prediction in (
        {"type": "content", "content": expected},
        {"type": "content", "content": [{"type": "text", "text": edited[:10]}, {"type": "text", "text": edited[10:]}]},
    ):
        resp = c.completions.create(
            model=MODEL,
            prompt="the cat",
            max_tokens=40,
            temperature=0,
            extra_body={"prediction": prediction, "speculation": {"drafters": ["prediction"]}},
        )
        assert resp.choices[0].text == expected
        details = resp.usage.completion_tokens_details
        spec = resp.usage.model_extra["speculative"]
        assert details.accepted_prediction_tokens == spec["accepted_by_drafter"]["prediction"] > 0
        assert (
            details.accepted_prediction_tokens + details.rejected_prediction_tokens
            == spec["drafted_by_drafter"]["prediction"]
        )
    # A chat prediction the answer shares nothing with: it is drafted once, whole, at the answer's
    # start and rejected at its first token; no output n-gram re-anchors it, so nothing more is
    # drafted from it: exactly its 3 tokens rejected, none accepted.
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 20, "temperature": 0}
    answer = c.chat.completions.create(**chat, extra_body={"speculation": {"enabled": False}}).choices[0].message
    predicted = "".join(ch for ch in "abcdefghijklmnopqrstuvwxyz" if ch not in answer.content)[:3]
    assert len(predicted) == 3, answer.content
    chat_resp = c.chat.completions.create(
        **chat,
        prediction={"type": "content", "content": predicted},
        extra_body={"speculation": {"drafters": ["prediction"]}},
    )
    assert chat_resp.choices[0].message.content == answer.content
    details = chat_resp.usage.completion_tokens_details
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (0, len(predicted))


@pytest.mark.parametrize(
    "prediction, message",
    [
        ({"type": "text", "content": "x"}, "prediction.type"),
        ({"type": "content"}, "prediction.content"),
        ({"type": "content", "content": [{"type": "image_url"}]}, "must be text"),
        ("just a string", "prediction"),
    ],
)
def test_a_malformed_prediction_is_a_400(structured_server, prediction, message):
    r = httpx.post(
        f"{structured_server.url}/v1/chat/completions",
        timeout=30,
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 5, "prediction": prediction},
    )
    assert r.status_code == 400 and message in r.text


def test_a_constraint_failing_mid_answer_is_a_400_naming_its_field(structured_server, monkeypatch):
    # llguidance can reach a lexer or parser limit only after some tokens ("too many expressions
    # constructed", "Current row has 2007 items"): the request's fault, so a 400 naming the field,
    # in the stream as an error event; the next request is served as usual.
    from draftwise.constraints import ConstraintError, Grammar

    real, calls = Grammar.consume, {"n": 0}

    def consume(self, token_ids):
        calls["n"] += 1
        if calls["n"] > 3:
            raise ConstraintError("the constraint cannot be followed: lexer error: too many expressions constructed")
        return real(self, token_ids)

    monkeypatch.setattr(Grammar, "consume", consume)
    c = client(structured_server.url)
    with pytest.raises(openai.BadRequestError, match="cannot be followed") as refused:
        c.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=40, temperature=0, extra_body={"regex": "[a-z ]{0,60}"}
        )
    assert refused.value.body["param"] == "regex"
    calls["n"] = 0
    stream = c.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=40,
        temperature=0,
        stream=True,
        response_format={"type": "json_object"},
    )
    with pytest.raises(openai.APIError, match="cannot be followed"):
        for _ in stream:
            pass
    monkeypatch.setattr(Grammar, "consume", real)
    resp = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=30, temperature=0)
    assert resp.choices[0].message.content == reference(None, max_tokens=30)
