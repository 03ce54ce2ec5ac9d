"""Each request is translated once (issue 70, item 3): through real HTTP, every protocol's route
calls its translator once per request, whole answers and streams alike, and nothing reads the
body after it: the translator's wrapper here empties the body's fields as it returns, so a later
read raises (a 500, or a broken stream) instead of answering.

The chat and completions bodies ask for what the reply carries (n, best_of, echo, logprobs,
include_usage), so an answer that read them from the body again would fail here."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from draftwise.backends.llamacpp import LlamaCppBackend
from draftwise.drafters import NgramDrafter
from draftwise.engine import Engine
from draftwise.server import anthropic_translate, ollama_translate, responses_translate, translate
from draftwise.types import SpeculationConfig

from .conftest import MODEL, LiveServer

# (route, translators the request passes through, once each): the Responses request is the chat
# request it means, translated by the chat translator inside its own.
ROUTES = {
    "chat": ("/v1/chat/completions", {"chat"}),
    "completions": ("/v1/completions", {"completions"}),
    "responses": ("/v1/responses", {"responses", "chat"}),
    "messages": ("/v1/messages", {"messages"}),
    "ollama_chat": ("/api/chat", {"ollama_chat"}),
    "ollama_generate": ("/api/generate", {"ollama_generate"}),
}
_TRANSLATORS = {
    "chat": (translate, "chat"),
    "completions": (translate, "completions"),
    "infill": (translate, "infill"),
    "responses": (responses_translate, "translate"),
    "messages": (anthropic_translate, "translate"),
    "ollama_chat": (ollama_translate, "chat"),
    "ollama_generate": (ollama_translate, "generate"),
}


def _body(kind: str, stream: bool) -> dict:
    user = [{"role": "user", "content": "count to three"}]
    if kind == "chat":
        usage = {"stream_options": {"include_usage": True}} if stream else {}
        return {"model": MODEL, "messages": user, "max_tokens": 4, "n": 2, "logprobs": True, "top_logprobs": 2, **usage}
    if kind == "completions":
        ranked = {} if stream else {"best_of": 2}  # best_of > n cannot be streamed
        return {"model": MODEL, "prompt": ["one two", "three"], "max_tokens": 4, "echo": True, "logprobs": 1, **ranked}
    if kind == "responses":
        return {"model": MODEL, "input": "count to three", "max_output_tokens": 4, "instructions": "be brief"}
    if kind == "messages":
        return {"model": MODEL, "messages": user, "max_tokens": 4, "stop_sequences": ["zzz"]}
    if kind == "ollama_chat":
        return {"model": MODEL, "messages": user, "options": {"num_predict": 4}}
    return {"model": MODEL, "prompt": "count to three", "options": {"num_predict": 4}}


def _poison(body) -> None:
    """Empty a pydantic body's fields: any later read is an AttributeError."""
    object.__setattr__(body, "__dict__", {})
    with pytest.raises(AttributeError):
        _ = body.stream


@pytest.fixture
def counted(monkeypatch) -> Counter:
    """Every translator wrapped: each call counted by name, its body emptied when it returns."""
    calls: Counter = Counter()
    for name, (module, attribute) in _TRANSLATORS.items():
        real = getattr(module, attribute)

        def wrapper(engine, body, *args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            out = _real(engine, body, *args, **kwargs)
            _poison(body)
            return out

        monkeypatch.setattr(module, attribute, wrapper)
    return calls


def _post(url: str, body: dict, stream: bool) -> str:
    r = httpx.post(url, json={**body, "stream": stream}, timeout=60)
    assert r.status_code == 200, r.text
    # a failure after a stream began: OpenAI's error chunk, Ollama's error line, an error event
    assert not any(failed in r.text for failed in ('"error": {', '{"error"', "event: error")), r.text
    return r.text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", list(ROUTES))
def test_each_request_is_translated_once_and_its_body_never_read_again(server, counted, kind, stream):
    path, translators = ROUTES[kind]
    text = _post(f"{server.url}{path}", _body(kind, stream), stream)
    assert counted == Counter(dict.fromkeys(translators, 1))
    if kind == "chat" and stream:  # the reply's settings reached the answer: two choices, logprobs, usage
        assert '"index": 1' in text and '"top_logprobs"' in text and '"usage": {"prompt_tokens"' in text
    if kind == "completions" and not stream:  # echo, logprobs and best_of's n best, one per prompt
        choices = httpx.Response(200, text=text).json()["choices"]
        assert len(choices) == 2 and all(c["text"].startswith(p) for c, p in zip(choices, ["one two", "three"]))
        assert all(c["logprobs"]["token_logprobs"][0] is None for c in choices)  # the echoed prompt's first


def test_a_request_refused_in_translation_is_translated_once(server, counted):
    """A refusal comes from the one translation (its APIError), and nothing is queued."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs", r.text
    assert counted == Counter(chat=1)


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path_factory.mktemp("fim") / "fim.gguf", fim=True)
    target = LlamaCppBackend(path, n_ctx=512, n_threads=1)
    engine = Engine(target, [NgramDrafter(1, 3)], speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4))
    with LiveServer(engine) as live:
        yield live
    target.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_infill_request_is_translated_once(fim_server, counted, stream):
    body = {"input_prefix": "def f(x):\n", "input_suffix": "\n", "n_predict": 4, "n_cmpl": 2, "n_indent": 4}
    text = _post(f"{fim_server.url}/infill", body, stream)
    assert counted == Counter(infill=1)
    if stream:  # each completion's final object, with the settings the reply carries
        assert text.count('"stop": true') == 2 and text.count('"n_indent": 4') == 2, text
    else:
        answers = httpx.Response(200, text=text).json()
        assert [a["generation_settings"]["n_indent"] for a in answers] == [4, 4]
