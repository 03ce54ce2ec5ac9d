"""Token sources through the OpenAI routes, with the openai client: asked for with the
`speculation.sources` extension, every streamed choice carries `token_sources` covering exactly its
text, the whole answer carries them on its choice, and usage.speculative counts tokens by source;
not asked for, no choice carries the field. The answer is the same either way.
"""

from __future__ import annotations

import openai

from tests.server.conftest import MODEL

SOURCES = {"speculation": {"sources": True}}
PROMPT = "abc abc abc abc abc abc"


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def chat(url: str, **kwargs):
    return client(url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=40, **kwargs
    )


def check_spans(spans: list[dict], text: str) -> None:
    assert "".join(s["text"] for s in spans) == text
    for s in spans:
        assert s["source"] in {"target", "grammar", "ngram", "draft"}
        assert s["step"] >= 1 and 0 <= s["accepted"] <= s["drafted"]


def test_streamed_chunks_carry_the_sources_of_their_text(server):
    plain = chat(server.url)
    stream = chat(server.url, stream=True, stream_options={"include_usage": True}, extra_body=SOURCES)
    text, spans, usage = "", [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            piece = choice.delta.content or ""
            got = (choice.model_extra or {}).get("token_sources", [])
            check_spans(got, piece)
            text += piece
            spans += got
    assert text == plain.choices[0].message.content
    check_spans(spans, text)
    by_source = usage.model_extra["speculative"]["tokens_by_source"]
    assert sum(by_source.values()) == usage.completion_tokens
    drafted = sum(1 for s in spans if s["source"] != "target")
    assert drafted > 0  # the toy target repeats itself: the drafters are right some of the time


def test_a_whole_answer_carries_them_on_its_choice(server):
    answer = chat(server.url, extra_body=SOURCES)
    spans = answer.choices[0].model_extra["token_sources"]
    check_spans(spans, answer.choices[0].message.content)
    completion = client(server.url).completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=20, echo=True, extra_body=SOURCES
    )
    choice = completion.choices[0]
    check_spans(choice.model_extra["token_sources"], choice.text[len(PROMPT) :])  # not the echoed prompt


def test_not_asked_no_choice_carries_them(server):
    answer = chat(server.url)
    assert "token_sources" not in (answer.choices[0].model_extra or {})
    for chunk in chat(server.url, stream=True):
        for choice in chunk.choices:
            assert "token_sources" not in (choice.model_extra or {})
