"""`draftwise serve` end to end: the real CLI in a subprocess, llama.cpp on tiny random
GGUF models (target + an identical twin as the draft), queried with the openai client."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

pytest.importorskip("gguf")
pytest.importorskip("llama_cpp")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(*args: str):
    """`draftwise serve ARGS --port P` in a subprocess, until it answers /health; its base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "draftwise.cli", "serve", *args, "--port", str(port)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"draftwise serve did not start:\n{proc.stdout.read()}")
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def cli_server(tiny_gguf_dir):
    args = ["--target", str(tiny_gguf_dir / "target.gguf"), "--draft", str(tiny_gguf_dir / "twin.gguf")]
    args += ["--policy", "fixed", "--k", "3", "--n-ctx", "256", "--threads", "1"]
    with serving(*args, "--api-key", "secret", "--model-name", "tiny") as url:
        yield url


def test_serve_answers_chat_with_speculation_and_reuses_both_caches(cli_server):
    c = openai.OpenAI(base_url=f"{cli_server}/v1", api_key="secret", max_retries=0, timeout=60)
    assert [m.id for m in c.models.list()] == ["tiny"]
    history = [{"role": "user", "content": "def add(a, b):"}]
    first = c.chat.completions.create(model="tiny", messages=history, max_tokens=16, temperature=0)
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "again"},
    ]
    second = c.chat.completions.create(model="tiny", messages=history, max_tokens=16, temperature=0)
    spec = second.usage.model_extra["speculative"]
    assert spec["num_drafted"] > 0 and spec["accepted_per_position"]
    assert spec["num_reused_tokens"] >= first.usage.prompt_tokens
    assert spec["num_draft_reused_tokens"] >= first.usage.prompt_tokens
    assert httpx.get(f"{cli_server}/v1/models").status_code == 401
    # bound to loopback: a rebinding page's Host and another site's Origin are refused before the key
    assert httpx.get(f"{cli_server}/v1/models", headers={"Host": "evil.example"}).status_code == 403
    foreign = httpx.post(f"{cli_server}/v1/models", headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "origin_not_allowed"


def test_serve_refuses_an_allowed_origin_that_is_no_origin():
    from click.testing import CliRunner

    from draftwise.cli import main

    result = CliRunner().invoke(main, ["serve", "--allowed-origins", "https://ok.example,localhost:3000"])
    assert result.exit_code != 0
    assert "allowed origin 'localhost:3000' is not an origin" in result.output


def test_serve_models_switches_between_the_models_of_a_folder(tiny_gguf_dir):
    """`serve --models DIR`: every GGUF of the folder listed, each loaded when first named, each
    answer the same after a switch (draft.gguf and target.gguf differ)."""
    import ollama

    args = ["--target", str(tiny_gguf_dir / "target.gguf"), "--models", str(tiny_gguf_dir), "--draft", "ngram"]
    args += ["--policy", "fixed", "--n-ctx", "256", "--threads", "1", "--parallel", "1", "--keep-alive", "-1"]
    with serving(*args) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
        names = [m.id for m in c.models.list()]
        assert names[0] == "target.gguf" and {"draft.gguf", "twin.gguf"} <= set(names)
        assert ollama.Client(host=url).ps().models == []  # nothing loaded until asked for
        answers = {}
        for name in ["target.gguf", "draft.gguf", "target.gguf"]:
            reply = c.completions.create(model=name, prompt="def add(a, b):", max_tokens=12, temperature=0)
            answers.setdefault(name, set()).add(reply.choices[0].text)
        assert all(len(texts) == 1 for texts in answers.values())  # the same answer after a switch
        assert answers["target.gguf"] != answers["draft.gguf"]
        assert {m.model for m in ollama.Client(host=url).ps().models} == {"target.gguf:latest", "draft.gguf:latest"}
