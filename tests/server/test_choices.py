"""Logprobs, echo, several prompts, n > 1, penalties and /tokenize over HTTP (the openai client),
on the toy engine; speculative answers report the same logprobs as plain decoding."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from draftwise.sampling import logprobs
from tests.server.conftest import MODEL, make_engine

PLAIN = {"speculation": {"enabled": False}}
SPEC = {"speculation": {"policy": "fixed", "max_draft_tokens": 4}}


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def server2():
    from tests.server.conftest import LiveServer

    with LiveServer(make_engine(slots=2)) as live:
        yield live


def test_chat_logprobs_speculative_equal_plain_and_streamed(server2):
    c = client(server2.url)
    kwargs = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "abc abc abc"}],
        max_tokens=24,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    plain = c.chat.completions.create(**kwargs, extra_body=PLAIN).choices[0]
    spec = c.chat.completions.create(**kwargs, extra_body=SPEC)
    assert spec.usage.speculative["num_accepted"] > 0
    spec = spec.choices[0]
    assert spec.message.content == plain.message.content
    assert len(plain.logprobs.content) == 24
    for a, b in zip(spec.logprobs.content, plain.logprobs.content):
        assert a.token == b.token and abs(a.logprob - b.logprob) < 1e-5
        assert len(a.top_logprobs) == 3 and [t.token for t in a.top_logprobs] == [t.token for t in b.top_logprobs]
        assert a.top_logprobs[0].logprob >= a.logprob - 1e-9  # greedy: the token is the top one
    chunks = list(c.chat.completions.create(**kwargs, extra_body=SPEC, stream=True))
    streamed = [e for ch in chunks for choice in ch.choices if choice.logprobs for e in choice.logprobs.content]
    assert [(e.token, round(e.logprob, 6)) for e in streamed] == [
        (e.token, round(e.logprob, 6)) for e in plain.logprobs.content
    ]


def test_echo_scores_the_prompt_with_max_tokens_0_and_1(server2):
    """lm-eval's loglikelihood request: echo, logprobs 1, temperature 0, max_tokens 0 or 1."""
    engine = server2.engine
    ids = engine.tokenizer.encode("hello world", add_special=True)
    table = engine.target._logits_fn  # the toy's exact logits for a context
    for max_tokens in (0, 1):
        r = httpx.post(
            f"{server2.url}/v1/completions",
            timeout=30,
            json={
                "model": MODEL,
                "prompt": ids,
                "echo": True,
                "logprobs": 1,
                "max_tokens": max_tokens,
                "temperature": 0,
            },
        ).json()
        choice = r["choices"][0]
        lp = choice["logprobs"]
        assert choice["text"].startswith("hello world")
        assert lp["token_logprobs"][0] is None and len(lp["tokens"]) == len(ids) + max_tokens
        assert lp["text_offset"][:2] == [0, 1]
        expected = [logprobs(table(ids[:i])[None], [ids[i]], 1)[0].logprob for i in range(1, len(ids))]
        np.testing.assert_allclose(lp["token_logprobs"][1 : len(ids)], expected, atol=1e-9)
        assert all(len(top) == 1 for top in lp["top_logprobs"][1:])


@pytest.mark.parametrize("max_tokens", [0, 8])
def test_streamed_echo_carries_the_prompts_logprobs_as_the_whole_answer_does(server2, max_tokens):
    c = client(server2.url)
    kwargs = dict(model=MODEL, prompt="hello world", echo=True, logprobs=2, max_tokens=max_tokens, temperature=0)
    whole = c.completions.create(**kwargs).choices[0]
    text, lp = "", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in c.completions.create(**kwargs, stream=True, extra_body=SPEC):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs:
                for key in lp:
                    lp[key] += getattr(choice.logprobs, key)
    assert text == whole.text and text.startswith("hello world")
    assert lp["tokens"] == whole.logprobs.tokens and lp["text_offset"] == whole.logprobs.text_offset
    assert lp["token_logprobs"][0] is None
    np.testing.assert_allclose(lp["token_logprobs"][1:], whole.logprobs.token_logprobs[1:], atol=1e-9)
    assert lp["top_logprobs"][1:] == whole.logprobs.top_logprobs[1:]


def test_several_prompts_and_token_id_prompts_give_several_choices(server2):
    c = client(server2.url)
    texts = ["abc", "xyz", "hello"]
    r = c.completions.create(model=MODEL, prompt=texts, max_tokens=6, temperature=0)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    for text, choice in zip(texts, r.choices):
        alone = c.completions.create(model=MODEL, prompt=text, max_tokens=6, temperature=0)
        assert choice.text == alone.choices[0].text
    ids = [server2.engine.tokenizer.encode(t, add_special=True) for t in texts[:2]]
    r2 = c.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0, n=2)
    assert [ch.index for ch in r2.choices] == [0, 1, 2, 3]  # prompt-major: prompt i, copy j -> i * n + j
    assert [ch.text for ch in r2.choices] == [r.choices[0].text] * 2 + [r.choices[1].text] * 2
    assert r2.usage.prompt_tokens == sum(len(x) for x in ids)


def test_n_choices_greedy_equal_sampled_independent_and_streamed_with_indices(server2):
    c = client(server2.url)
    msgs = [{"role": "user", "content": "tell"}]
    greedy = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0, n=3)
    assert len({ch.message.content for ch in greedy.choices}) == 1 and len(greedy.choices) == 3
    sampled = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=1.0, n=5, seed=1)
    assert len({ch.message.content for ch in sampled.choices}) > 1  # n slots > 2: the rest queued, all answered
    again = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=1.0, n=5, seed=1)
    assert [ch.message.content for ch in again.choices] == [ch.message.content for ch in sampled.choices]
    texts: dict[int, str] = {}
    finished = set()
    for chunk in c.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=12, temperature=1.0, n=5, seed=1, stream=True
    ):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == set(range(5))
    assert [texts[i] for i in range(5)] == [ch.message.content for ch in sampled.choices]


def test_best_of_returns_the_n_candidates_with_the_highest_mean_logprob(server2):
    c = client(server2.url)
    kwargs = dict(model=MODEL, prompt="tell", max_tokens=10, temperature=1.0, seed=3)
    candidates = c.completions.create(**kwargs, n=6, logprobs=0)  # the same six candidates, all shown
    assert len({ch.text for ch in candidates.choices}) > 2

    def mean(choice):
        return sum(choice.logprobs.token_logprobs) / len(choice.logprobs.token_logprobs)

    ranked = sorted(range(6), key=lambda i: (-mean(candidates.choices[i]), i))
    best = c.completions.create(**kwargs, n=2, best_of=6)
    assert [ch.text for ch in best.choices] == [candidates.choices[i].text for i in ranked[:2]]
    assert [ch.index for ch in best.choices] == [0, 1] and best.choices[0].logprobs is None  # not asked for
    assert best.usage.completion_tokens == candidates.usage.completion_tokens  # every candidate counts
    one = c.completions.create(**kwargs, best_of=6)
    assert [ch.text for ch in one.choices] == [candidates.choices[ranked[0]].text]
    for extra, why in (({"n": 3, "best_of": 2}, "at least n"), ({"best_of": 2, "stream": True}, "streamed")):
        with pytest.raises(openai.BadRequestError, match=why) as caught:
            c.completions.create(**{**kwargs, **extra})
        assert caught.value.body["param"] == "best_of"


def test_penalties_and_logit_bias_are_honoured(server2):
    c = client(server2.url)
    token = server2.engine.tokenizer.encode("q", add_special=False)[0]
    r = c.completions.create(model=MODEL, prompt="abc", max_tokens=5, temperature=0, logit_bias={str(token): 100})
    assert r.choices[0].text == "q" * 5
    plain = c.completions.create(model=MODEL, prompt="abab", max_tokens=16, temperature=0)
    penalised = c.completions.create(
        model=MODEL,
        prompt="abab",
        max_tokens=16,
        temperature=0,
        frequency_penalty=2.0,
        presence_penalty=2.0,
        extra_body={"repeat_penalty": 1.5},
    )
    assert penalised.choices[0].text != plain.choices[0].text


def test_tokenize_and_detokenize_in_llama_cpp_shape(server2):
    ids = httpx.post(f"{server2.url}/tokenize", json={"content": "hello"}).json()["tokens"]
    assert ids == server2.engine.tokenizer.encode("hello", add_special=False)
    pieces = httpx.post(f"{server2.url}/tokenize", json={"content": "hi", "with_pieces": True}).json()["tokens"]
    assert [p["piece"] for p in pieces] == ["h", "i"]
    assert httpx.post(f"{server2.url}/detokenize", json={"tokens": ids}).json()["content"] == "hello"
    # vLLM's names, which lm-eval's remote tokenizer uses
    assert httpx.post(f"{server2.url}/tokenize", json={"prompt": "hello", "add_special_tokens": False}).json() == {
        "tokens": ids
    }
    assert httpx.post(f"{server2.url}/detokenize", json={"tokens": ids}).json()["prompt"] == "hello"
    assert "eos_token" in httpx.get(f"{server2.url}/tokenizer_info").json()
    bad = httpx.post(f"{server2.url}/detokenize", json={"tokens": [10_000]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_more_choices_than_the_server_can_hold_are_a_400_before_anything_is_queued():
    from draftwise.server import create_app
    from tests.server.conftest import LiveServer

    engine = make_engine(slots=2)
    with LiveServer(engine, app=create_app(engine, MODEL, max_queue=3)) as live:
        c = client(live.url)
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as err:
                c.completions.create(model=MODEL, prompt=["ab", "cd"], n=3, max_tokens=4, stream=stream)
            assert err.value.body["code"] == "too_many_choices"
            assert "6 choices (2 prompt(s) x 3)" in err.value.body["message"]
            assert "at most 5" in err.value.body["message"]
        assert live.app.state.serving.queue_length == 0 and not live.app.state.serving.running
        # As many as it holds are served.
        answer = c.completions.create(model=MODEL, prompt=["ab"], n=5, max_tokens=4)
        assert len(answer.choices) == 5
