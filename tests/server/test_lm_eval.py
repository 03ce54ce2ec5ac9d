"""lm-evaluation-harness against the server, as evaluators run it: its `local-completions` model
(token-id prompts, `echo` + `logprobs` for loglikelihood, `stop` for generate_until, the server's
own tokenizer through /tokenize and /tokenizer_info) on the two local tasks of
scripts/lm_eval_tasks, once with speculation off and once on (n-gram drafts, fixed k = 4). Every
loglikelihood and every generated answer must be the same; the full run on the default pair is
scripts/lm_eval_check.sh.

The model is a tiny random GGUF (answers are noise, but deterministic), served by llama.cpp."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftwise.backends.llamacpp import LlamaCppBackend
from draftwise.drafters import NgramDrafter
from draftwise.engine import Engine
from draftwise.types import SpeculationConfig

from .conftest import MODEL, LiveServer

TASKS = Path(__file__).resolve().parents[2] / "scripts" / "lm_eval_tasks"
LIMIT = 4  # documents per task


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("lm-eval") / "tiny.gguf")


def evaluate(path: Path, speculation: SpeculationConfig, monkeypatch) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the tasks' data are local files
    monkeypatch.chdir(TASKS)  # their data_files are relative to the tasks' folder
    target = LlamaCppBackend(path, n_ctx=512, n_threads=1)
    try:
        engine = Engine(target, [NgramDrafter(1, 3)], speculation=speculation)
        with LiveServer(engine) as live:
            return lm_eval.simple_evaluate(
                model="local-completions",
                model_args={
                    "base_url": f"{live.url}/v1/completions",
                    "model": MODEL,
                    "tokenizer_backend": "remote",
                    "tokenized_requests": True,
                    "num_concurrent": 1,
                    "max_retries": 1,
                },
                tasks=["draftwise_mc", "draftwise_gen"],
                task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
                limit=LIMIT,
                log_samples=True,
            )
    finally:
        target.close()


def answers(results: dict, task: str) -> list:
    return [(s["doc_id"], s["resps"]) for s in sorted(results["samples"][task], key=lambda s: s["doc_id"])]


def test_lm_eval_same_results_with_speculation_off_and_on(tiny_gguf, monkeypatch):
    off = evaluate(tiny_gguf, SpeculationConfig(enabled=False), monkeypatch)
    on = evaluate(tiny_gguf, SpeculationConfig(policy="fixed", max_draft_tokens=4), monkeypatch)
    for task in ("draftwise_mc", "draftwise_gen"):
        assert len(off["samples"][task]) == LIMIT
        assert answers(on, task) == answers(off, task), task
        assert on["results"][task] == off["results"][task]
    # loglikelihoods are real numbers the harness read from the server's echoed prompt logprobs
    first = off["samples"]["draftwise_mc"][0]["resps"][0][0]
    assert isinstance(first[0], float) and first[0] < 0
    # generate_until made the server generate (not an empty answer for every document)
    assert any(s["resps"][0][0] for s in off["samples"]["draftwise_gen"])
