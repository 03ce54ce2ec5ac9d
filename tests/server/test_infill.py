"""/infill and /v1/completions with suffix through real HTTP: the bodies llama.vim and llama.vscode
send (fixtures/infill_bodies.json), the warm-up, streaming as llama.cpp streams it, greedy answers
equal with speculation on and off, a superseded request, and a model without FIM tokens.

The FIM model is a tiny random GGUF holding Qwen2.5-Coder's FIM tokens (its answers are noise,
but deterministic); the superseding test runs a slow toy whose tokenizer names FIM tokens."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from draftwise.backends.llamacpp import LlamaCppBackend
from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.drafters import NgramDrafter
from draftwise.engine import Engine
from draftwise.fim import fim_prompt
from draftwise.types import SamplingParams, SpeculationConfig

from .conftest import MODEL, LiveServer
from .test_server import metric

BODIES = json.loads((Path(__file__).parent / "fixtures" / "infill_bodies.json").read_text())
GREEDY = {"samplers": ["temperature"], "temperature": 0.0}


@pytest.fixture(scope="module")
def fim_engine(tmp_path_factory):
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path_factory.mktemp("fim") / "fim.gguf", fim=True)
    target = LlamaCppBackend(path, n_ctx=2048, n_threads=1)
    yield Engine(target, [NgramDrafter(1, 3)], speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4))
    target.close()


@pytest.fixture(scope="module")
def fim_server(fim_engine):
    with LiveServer(fim_engine) as live:
        yield live


def infill(server, body, **kwargs):
    r = httpx.post(f"{server.url}/infill", json=body, timeout=60, **kwargs)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("name", ["llama_vim", "llama_vscode", "response_fields"])
def test_editor_bodies_get_the_fields_editors_read(fim_server, name):
    body = BODIES[name]
    answer = infill(fim_server, body)
    if "response_fields" in body:  # the client names what it reads; nothing else comes back
        assert set(answer) == set(body["response_fields"])
        assert isinstance(answer["content"], str) and answer["timings/predicted_n"] >= 1
        return
    if body.get("n_cmpl", 1) > 1:  # llama.vscode's 3 completions: a list, as llama.cpp answers
        assert isinstance(answer, list) and [a["index"] for a in answer] == list(range(body["n_cmpl"]))
        for one in answer:
            check_result(one, body)
        return
    check_result(answer, body)


def check_result(answer, body):
    assert isinstance(answer["content"], str) and answer["stop"] is True
    assert answer["stop_type"] in ("eos", "word", "limit") and answer["truncated"] is False
    assert 1 <= answer["tokens_predicted"] <= body["n_predict"]
    assert answer["generation_settings"]["n_ctx"] == 2048 and isinstance(answer["tokens_cached"], int)
    timings = answer["timings"]
    assert timings["prompt_n"] + timings["cache_n"] == answer["tokens_evaluated"]
    assert timings["predicted_n"] == answer["tokens_predicted"] and timings["predicted_ms"] > 0


def test_an_answer_ended_by_eos_counts_the_eos_as_llamacpp_does(fim_server, fim_engine):
    """llama.cpp's tokens_predicted and timings.predicted_n are its n_decoded: every sampled token,
    the EOS that ended the answer included, so an answer that is only an EOS reports 1."""
    eos = min(fim_engine.tokenizer.eos_token_ids)
    body = {**BODIES["response_fields"], **GREEDY, "response_fields": None, "logit_bias": [[eos, 100]]}
    answer = infill(fim_server, body)
    assert answer["content"] == "" and answer["stop_type"] == "eos"
    assert answer["tokens_predicted"] == answer["timings"]["predicted_n"] == 1


@pytest.mark.parametrize("name", ["llama_vim_warmup", "llama_vim_warmup_n0", "llama_vscode_prep"])
def test_warmup_fills_the_cache_for_the_next_request(fim_server, name):
    warm = infill(fim_server, BODIES[name])
    if BODIES[name]["n_predict"] == 0:
        assert warm["content"] == "" and warm["tokens_predicted"] == 0
    # the next request shares the extra context: everything before the file's own text is reused
    answer = infill(fim_server, {**BODIES["llama_vim"], "input_extra": BODIES[name]["input_extra"]})
    chunk = BODIES[name]["input_extra"][0]
    header = len(fim_prompt(fim_server.engine.tokenizer, "", "", extra=[(chunk["filename"], chunk["text"])]).ids) - 3
    assert answer["timings"]["cache_n"] >= header


def test_n_cmpl_completions_are_independent_samples_and_greedy_ones_agree(fim_server):
    base = {**BODIES["llama_vscode"], "n_indent": 0, "n_predict": 8, "t_max_predict_ms": 0}
    greedy = infill(fim_server, {**base, **GREEDY})
    assert len(greedy) == 3 and len({a["content"] for a in greedy}) == 1
    assert greedy[0]["content"] == infill(fim_server, {**base, **GREEDY, "n_cmpl": 1})["content"]
    sampled = infill(fim_server, {**base, "samplers": ["temperature"], "temperature": 1.5, "seed": 7, "n_cmpl": 4})
    assert len({a["content"] for a in sampled}) > 1  # four seeds of one request: not one answer
    again = infill(fim_server, {**base, "samplers": ["temperature"], "temperature": 1.5, "seed": 7, "n_cmpl": 4})
    assert [a["content"] for a in again] == [a["content"] for a in sampled]  # seeded: reproducible


def test_n_cmpl_completions_stream_with_their_index(fim_server):
    body = {**BODIES["llama_vscode"], **GREEDY, "n_indent": 0, "n_predict": 8, "t_max_predict_ms": 0}
    whole = infill(fim_server, body)
    texts, finals = {}, []
    with httpx.stream("POST", f"{fim_server.url}/infill", json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line:
                event = json.loads(line[len("data: ") :])
                (finals if event["stop"] else []).append(event["index"])
                texts[event["index"]] = texts.get(event["index"], "") + event["content"]
    assert sorted(finals) == [0, 1, 2]
    assert [texts[i] for i in range(3)] == [a["content"] for a in whole]


@pytest.mark.parametrize("n_cmpl", [0, 17, "3"])
def test_n_cmpl_out_of_range_is_a_400_naming_it(fim_server, n_cmpl):
    r = httpx.post(f"{fim_server.url}/infill", json={**BODIES["llama_vscode"], "n_cmpl": n_cmpl}, timeout=30)
    assert r.status_code == 400 and "n_cmpl" in r.text


def test_stream_is_llamacpp_events_and_equals_the_whole_answer(fim_server):
    body = {**BODIES["llama_vim"], **GREEDY, "n_indent": 0, "n_predict": 24}
    whole = infill(fim_server, body)
    events = []
    with httpx.stream("POST", f"{fim_server.url}/infill", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:
                assert line.startswith("data: ") and line != "data: [DONE]"
                events.append(json.loads(line[len("data: ") :]))
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert events[-1]["content"] == "" and "timings" in events[-1]
    assert "".join(e["content"] for e in events) == whole["content"]


def test_greedy_infill_equal_with_speculation_on_and_off(fim_server):
    body = {**BODIES["llama_vim"], **GREEDY, "n_indent": 0, "t_max_predict_ms": 0, "n_predict": 48, "ignore_eos": True}
    plain = infill(fim_server, {**body, "speculation": {"enabled": False}})
    spec = infill(fim_server, {**body, "speculation": {"policy": "fixed", "max_draft_tokens": 4}})
    assert spec["content"] == plain["content"] and spec["tokens_predicted"] == plain["tokens_predicted"] == 48
    assert spec["timings"].get("draft_n", 0) > 0 and "draft_n" not in plain["timings"]


def test_completions_suffix_through_openai_client(fim_server, fim_engine):
    client = openai.OpenAI(base_url=f"{fim_server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    kwargs = {
        "model": MODEL,
        "prompt": "def add(a, b):\n    return ",
        "suffix": "\n\nprint(add(1, 2))\n",
        "max_tokens": 16,
        "temperature": 0,
    }
    whole = client.completions.create(**kwargs)
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True) if c.choices)
    ids = fim_prompt(fim_engine.tokenizer, kwargs["prompt"], kwargs["suffix"], repo_level=False).ids
    expected = fim_engine.generate(prompt_ids=ids, sampling=SamplingParams(max_tokens=16)).text
    assert whole.choices[0].text == streamed == expected
    assert whole.usage.prompt_tokens == len(ids)


def test_unsupported_and_bad_fields_are_400(fim_server):
    for extra in (
        {"dry_multiplier": 0.8},
        {"samplers": ["mirostat"]},
        {"input_extra": [{"filename": "x"}]},
        {"logit_bias": [[10**9, 1.0]]},
        {"repeat_penalty": 0, "samplers": ["penalties"]},
    ):
        r = httpx.post(f"{fim_server.url}/infill", json={**BODIES["llama_vim"], **extra}, timeout=30)
        assert r.status_code == 400, extra
        assert "error" in r.json()
    ok = infill(fim_server, {**BODIES["llama_vim"], "n_predict": 2, "id_slot": 1, "dry_base": 2.0, "n_keep": -1})
    assert ok["stop"] is True  # llama.cpp fields that change nothing here are ignored


def test_penalties_and_logit_bias_change_the_answer_and_stay_exact_under_speculation(fim_server):
    body = {**BODIES["llama_vim"], **GREEDY, "n_indent": 0, "t_max_predict_ms": 0, "n_predict": 24, "ignore_eos": True}
    plain = infill(fim_server, {**body, "return_tokens": True, "speculation": {"enabled": False}})
    banned = plain["tokens"][0]
    for extra in (
        {"logit_bias": [[banned, False]]},
        {"samplers": ["penalties", "temperature"], "repeat_penalty": 1.5, "repeat_last_n": -1},
        {"samplers": ["penalties", "temperature"], "frequency_penalty": 1.0, "presence_penalty": 0.5},
    ):
        off = infill(fim_server, {**body, **extra, "return_tokens": True, "speculation": {"enabled": False}})
        on = infill(
            fim_server,
            {**body, **extra, "return_tokens": True, "speculation": {"policy": "fixed", "max_draft_tokens": 4}},
        )
        assert on["tokens"] == off["tokens"], extra  # exact: every verified row is penalised given its history
        assert off["tokens"] != plain["tokens"], extra  # and they do change the answer
        if "logit_bias" in extra:
            assert banned not in off["tokens"]


def test_model_without_fim_tokens_gets_400(server):
    r = httpx.post(f"{server.url}/infill", json=BODIES["llama_vim"], timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "fim_unsupported"
    r = httpx.post(
        f"{server.url}/v1/completions",
        timeout=30,
        json={"model": MODEL, "prompt": "ab", "suffix": "cd", "max_tokens": 2},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"


def slow_fim_engine(step_delay_s: float) -> Engine:
    """A toy target (vocab 100) that takes step_delay_s per forward, its last tokens named FIM tokens."""
    model = ToyModel(vocab_size=100, sharpness=3, eos_bias=-30)

    def slow_logits(context):
        time.sleep(step_delay_s)
        return model.logits(context)

    target = ToyBackend(logits_fn=slow_logits, vocab_size=100, n_ctx=4096, name="slow-toy")
    target.tokenizer.fim_token_ids = lambda: {"prefix": 97, "suffix": 98, "middle": 99}
    return Engine(target, [], speculation=SpeculationConfig(policy="fixed", enabled=False))  # nothing to calibrate


def test_a_newer_request_from_the_same_client_supersedes_the_running_one(start_server):
    live = start_server(slow_fim_engine(0.02))
    body = {
        "input_prefix": "def f(x):\n",
        "input_suffix": "\n",
        "prompt": "    ret",
        "n_predict": 2000,
        "ignore_eos": True,
        **GREEDY,
    }
    first: dict = {}
    thread = threading.Thread(target=lambda: first.update(infill(live, body)))
    thread.start()
    serving = live.app.state.serving
    while not serving.running and thread.is_alive():  # until the first is decoding
        time.sleep(0.01)
    second = infill(live, {**body, "prompt": "    retu", "n_predict": 3})
    # When the second's answer came, the first had already ended, cancelled: it did not wait for its 2000 tokens.
    ended = 'draftwise_requests_total{endpoint="infill",finish_reason="%s"}'
    ended_before_second = {reason: metric(live.url, ended % reason) for reason in ("cancelled", "length")}
    thread.join(10)
    assert first["superseded"] is True and first["tokens_predicted"] < 2000
    assert second["tokens_predicted"] == 3 and "superseded" not in second
    assert ended_before_second == {"cancelled": 1, "length": 1}  # the first cancelled, the second's 3 tokens


def test_another_client_does_not_supersede(fim_engine):
    """Two API keys are two clients: both answers come whole, the second after the first."""
    from draftwise.server import create_app

    with LiveServer(fim_engine, app=create_app(fim_engine, MODEL, api_keys=("key-a", "key-b"))) as live:
        body = {**BODIES["llama_vim"], **GREEDY, "n_predict": 64, "ignore_eos": True, "n_indent": 0}
        results: list[dict] = []
        threads = [
            threading.Thread(
                target=lambda k=k: results.append(infill(live, body, headers={"Authorization": f"Bearer {k}"}))
            )
            for k in ("key-a", "key-b")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert len(results) == 2 and all(r["tokens_predicted"] == 64 and "superseded" not in r for r in results)


def test_keystroke_replay_through_bench_serve(start_server, tmp_path):
    """`draftwise bench-serve --keystrokes` against a live server: at typing speed a newer request
    supersedes the running one; one after another, the warm cache is reused and the cold
    requests (a unique first chunk each) reuse nothing after the prompt's fixed opening."""
    from click.testing import CliRunner

    from draftwise.cli import main

    live = start_server(slow_fim_engine(0.01))
    out = tmp_path / "keys"
    args = ["--keystrokes", "--sessions", "2", "--chars", "6", "--every", "2", "--char-ms", "5"]
    args += ["--prefix-lines", "6", "--suffix-lines", "3", "--max-tokens", "24", "--out", str(out)]
    result = CliRunner().invoke(main, ["bench-serve", "--url", live.url, *args])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    summary = {s["mode"]: s for s in results["summary"]}
    assert {s["requests"] for s in summary.values()} == {6} and all(s["errors"] == 0 for s in summary.values())
    assert summary["typing"]["superseded"] >= 1 and summary["typing"]["answered"] >= 2  # each session's last answers
    assert summary["warm"]["superseded"] == summary["cold"]["superseded"] == 0
    # typing and warm sessions first ask at the opened line and wait for its answer; in no latency
    assert summary["typing"]["opened"] == summary["warm"]["opened"] == 2 and summary["cold"]["opened"] == 0
    opened = [r for r in results["records"] if r["typed"] == 0]
    assert len(opened) == 4 and all(r["ok"] and not r["superseded"] for r in opened)
    # cold: only the prompt's fixed opening (the repo header before the first chunk) is reused
    assert summary["cold"]["median_cache_n"] < summary["warm"]["median_cache_n"] / 4
    assert summary["warm"]["median_prompt_n"] < summary["cold"]["median_prompt_n"]
    report = (out / "report.md").read_text()
    assert "| typing |" in report and "Median latency against cold: typing" in report
    # each answered request against the same request sent cold
    same = {a["mode"]: a for a in results["against_cold"]}
    assert same["warm"]["pairs"] == 6 and same["typing"]["pairs"] == summary["typing"]["answered"]
    assert "Against the same requests sent cold" in report
