"""Serving without HTTP: jobs run one at a time in arrival order, a job cancelled while it
waits never reaches the engine, and every job gets an answer."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from draftwise.server.serving import Finished, Job, JobCancelled, JobFailed, Piece, Serving
from draftwise.types import SamplingParams
from tests.server.conftest import MODEL, make_engine, wait_idle


async def drain(job: Job) -> Finished | JobFailed:
    while True:
        event = await job.next_event()
        if not isinstance(event, Piece):
            return event


def test_jobs_run_in_arrival_order_and_a_queued_cancel_skips_the_engine():
    engine = make_engine(step_delay_s=0.001)
    serving = Serving(engine)

    async def scenario():
        jobs = []
        for i in range(6):
            job = Job(f"job-{i}", "completions", engine.encode_prompt(f"prompt {i}"))
            jobs.append(serving.submit(job, SamplingParams(max_tokens=12), None, None))
        jobs[4].cancel("client disconnected")  # still queued behind the others
        return jobs, await asyncio.gather(*(drain(j) for j in jobs))

    try:
        jobs, events = asyncio.run(scenario())
    finally:
        serving.close()
    assert isinstance(events[4], JobFailed) and isinstance(events[4].error, JobCancelled)
    assert jobs[4].started_at is None
    done = [j for j in jobs if j is not jobs[4]]
    assert all(isinstance(events[jobs.index(j)], Finished) for j in done)
    starts = [j.started_at for j in done]
    assert starts == sorted(starts)  # FIFO: each started after the one submitted before it
    for j, event in zip(jobs, events):
        if isinstance(event, Finished):
            expected = make_engine().generate(f"prompt {jobs.index(j)}", sampling=SamplingParams(max_tokens=12))
            assert event.result.token_ids == expected.token_ids


def test_a_non_streaming_client_that_gives_up_cancels_its_generation(start_server):
    live = start_server(make_engine(step_delay_s=0.002))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{live.url}/v1/completions",
            timeout=0.3,
            json={"model": MODEL, "prompt": "never read", "max_tokens": 3000, "ignore_eos": True, "temperature": 0},
        )
    serving = live.app.state.serving

    assert wait_idle(serving), "the abandoned generation kept running"
    text = httpx.get(f"{live.url}/metrics").text
    assert 'draftwise_requests_total{endpoint="completions",finish_reason="cancelled"} 1.0' in text


def test_an_idle_worker_ends_and_the_next_job_starts_another(monkeypatch):
    """The worker thread ends after WORKER_IDLE_S with nothing to do (its llama.cpp OpenMP team
    with it: compute_thread.py); a job submitted later starts a new one and is answered as before."""
    from draftwise.server import serving as serving_module

    monkeypatch.setattr(serving_module, "WORKER_IDLE_S", 0.05)
    engine = make_engine()
    serving = Serving(engine)

    async def one(i: int) -> Finished | JobFailed:
        job = serving.submit(
            Job(f"job-{i}", "completions", engine.encode_prompt("again")), SamplingParams(max_tokens=6), None, None
        )
        return await drain(job)

    async def scenario():
        first = await one(0)
        worker = serving._thread
        for _ in range(200):  # the worker sees its idle time out and ends
            if serving._thread is None and not worker.is_alive():
                break
            await asyncio.sleep(0.01)
        ended = serving._thread is None and not worker.is_alive()
        return first, worker, ended, await one(1)

    try:
        first, worker, ended, second = asyncio.run(scenario())
    finally:
        serving.close()
    assert ended, "the idle worker did not end"
    assert isinstance(first, Finished) and isinstance(second, Finished)
    assert second.result.token_ids == first.result.token_ids
    assert serving._thread is not worker
