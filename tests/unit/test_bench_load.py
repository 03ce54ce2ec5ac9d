"""bench-serve against a fake OpenAI-compatible server (uvicorn in a thread): request and error counts,
token counts from usage or deltas, ordered percentiles, the files, the CLI and the compare table."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import httpx
import pytest
import uvicorn
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from draftwise.bench.serving import load, load_report, serve_process
from draftwise.cli import main

PIECES = ["Hel", "lo", " wor", "ld"]
USAGE_TOKENS = 8  # NOTE: not len(PIECES), so a count taken from the deltas instead of usage shows
SPECULATIVE = {"num_drafted": 6, "num_accepted": 3}
# The fake server acts on the user message: these three fail, in three different ways; anything else succeeds.
FAILING = ("fail-503", "fail-event", "fail-cut")


def sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def fake_app(*, usage: bool = True, piece_delay_s: float = 0.01, api_key: str | None = None) -> Starlette:
    """Streams PIECES piece_delay_s apart, then (if usage) a usage chunk; app.state keeps bodies and peak in-flight.

    With api_key, every route but /health answers 401 to a request without 'Authorization: Bearer KEY'.
    """
    state = {"bodies": [], "in_flight": 0, "max_in_flight": 0}

    def refused(request) -> JSONResponse | None:
        if api_key is None or request.headers.get("authorization") == f"Bearer {api_key}":
            return None
        return JSONResponse({"error": {"message": "invalid API key", "type": "invalid_request_error"}}, status_code=401)

    async def chat(request):
        if (refusal := refused(request)) is not None:
            return refusal
        body = await request.json()
        state["bodies"].append(body)
        prompt = body["messages"][0]["content"]
        if prompt == "fail-503":
            return JSONResponse({"error": {"message": "server busy", "type": "server_error"}}, status_code=503)

        async def events():
            state["in_flight"] += 1
            state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
            try:
                yield sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
                for piece in PIECES:
                    await asyncio.sleep(piece_delay_s)
                    yield sse({"choices": [{"index": 0, "delta": {"content": piece}}]})
                if prompt == "fail-event":
                    yield sse({"error": {"message": "generation failed: boom", "type": "server_error"}})
                if prompt == "fail-cut":
                    return
                yield sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
                if usage:
                    yield sse(
                        {
                            "choices": [],
                            "usage": {
                                "prompt_tokens": 3,
                                "completion_tokens": USAGE_TOKENS,
                                "total_tokens": 3 + USAGE_TOKENS,
                                "speculative": SPECULATIVE,
                            },
                        }
                    )
                yield "data: [DONE]\n\n"
            finally:
                state["in_flight"] -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request):
        if (refusal := refused(request)) is not None:
            return refusal
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def health(request):
        return JSONResponse({"status": "ok"})

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", health),
        ]
    )
    app.state.fake = state
    return app


class FakeServer:
    """uvicorn serving an app from a daemon thread on a free loopback port; `url` is its base URL."""

    def __init__(self, app) -> None:
        self.app = app
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def fake():
    with FakeServer(fake_app()) as server:
        yield server


PROMPTS = ["ok one", "fail-503", "ok two", "fail-event", "ok three", "fail-cut"]


@pytest.fixture(scope="module")
def results(fake):
    return load.run_bench(fake.url, PROMPTS, [1, 3], num_requests=6, max_tokens=16, meta={"label": "fake"})


def test_levels_count_requests_tokens_and_errors(results):
    assert [s["concurrency"] for s in results["levels"]] == [1, 3]
    for s in results["levels"]:
        assert s["num_requests"] == 6 and s["num_errors"] == 3
        assert s["num_tokens"] == 3 * USAGE_TOKENS  # successful requests only, counted from usage
        assert s["num_drafted"] == 3 * SPECULATIVE["num_drafted"]
        assert s["num_accepted"] == 3 * SPECULATIVE["num_accepted"]
        assert s["errors"] == {
            "503: server busy": 1,
            "200: generation failed: boom": 1,
            "200: the stream ended before [DONE]": 1,
        }
        assert s["tokens_per_second"] == pytest.approx(s["num_tokens"] / s["wall_s"])
    records = results["records"]
    assert len(records) == 12
    for c in (1, 3):
        level = [r for r in records if r["concurrency"] == c]
        assert [r["index"] for r in level] == list(range(6))
        assert [r["ok"] for r in level] == [not PROMPTS[i].startswith("fail") for i in range(6)]
    for r in records:
        if r["ok"]:
            assert r["num_tokens"] == USAGE_TOKENS and r["tokens_from_usage"] and r["status"] == 200
            assert 0 < r["ttft_s"] <= r["latency_s"]
    assert results["meta"]["model"] == "fake-model" and results["meta"]["label"] == "fake"


def test_percentiles_are_ordered(results):
    for s in results["levels"]:
        assert s["ttft_p50_s"] <= s["ttft_p95_s"] <= s["latency_max_s"]
        assert s["latency_p50_s"] <= s["latency_p95_s"] <= s["latency_max_s"]
        ok = [r for r in results["records"] if r["concurrency"] == s["concurrency"] and r["ok"]]
        assert s["latency_max_s"] == max(r["latency_s"] for r in ok)
        assert s["request_tokens_per_second_p50"] > 0


def test_requests_are_streaming_greedy_chat_with_usage_and_at_most_c_at_once(results, fake):
    state = fake.app.state.fake
    assert len(state["bodies"]) == 1 + 12  # the warm-up, then the levels
    for body in state["bodies"][1:]:
        assert body["stream"] is True and body["temperature"] == 0 and body["max_tokens"] == 16
        assert body["stream_options"] == {"include_usage": True} and body["model"] == "fake-model"
        assert body["messages"][0]["role"] == "user" and body["messages"][0]["content"] in PROMPTS
    assert 2 <= state["max_in_flight"] <= 3


def test_without_usage_tokens_are_content_deltas():
    with FakeServer(fake_app(usage=False, piece_delay_s=0)) as server:
        out = load.run_bench(server.url + "/v1/", ["hi"], [2], num_requests=4)
    (s,) = out["levels"]
    assert s["num_errors"] == 0 and s["num_tokens"] == 4 * len(PIECES)
    assert not any(r["tokens_from_usage"] for r in out["records"]) and s["num_drafted"] is None


def test_api_key_is_sent_and_a_refusal_is_a_clear_error():
    with FakeServer(fake_app(api_key="sk-1", piece_delay_s=0)) as server:
        with pytest.raises(load.LoadError, match="answered 401: invalid API key"):
            load.run_bench(server.url, ["hi"], [1], num_requests=1)
        out = load.run_bench(server.url, ["hi"], [1], num_requests=2, api_key="sk-1")
    assert out["levels"][0]["num_errors"] == 0 and out["levels"][0]["num_tokens"] == 2 * USAGE_TOKENS


def test_api_keys_are_redacted_from_command_lines():
    assert serve_process.redact_api_keys(
        [
            "bench-serve",
            "--api-key",
            "sk-1",
            "--serve-args",
            "--api-key=sk-2 --k 8",
            "--serve-args",
            "--draft ngram --api-key 'sk 3'",
        ]
    ) == [
        "bench-serve",
        "--api-key",
        "REDACTED",
        "--serve-args",
        "--api-key=REDACTED --k 8",
        "--serve-args",
        "--draft ngram --api-key REDACTED",
    ]


def test_failed_warm_up_is_a_clear_error(fake):
    with pytest.raises(load.LoadError, match="warm-up request failed.*server busy"):
        load.run_bench(fake.url, ["fail-503"], [1], num_requests=1)


def test_files_are_written(results, tmp_path):
    report = load_report.write_outputs(results, tmp_path)
    assert load_report.load_run(tmp_path) == json.loads(json.dumps(results))
    text = report.read_text()
    assert "| C | requests | errors |" in text and "| 3 | 6 | 3 |" in text and "server busy" in text
    assert "| 1 | 6 | 3 |" in text and "50%" in text  # acceptance 3/6
    assert (tmp_path / "throughput.png").read_bytes().startswith(b"\x89PNG")


def test_cli_with_url(fake, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main,
        [
            "bench-serve",
            "--url",
            fake.url,
            "--concurrency",
            "1,2",
            "--requests",
            "3",
            "--max-tokens",
            "8",
            "--suite",
            "quick",
            "--label",
            "fake",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "| C | requests |" in result.stdout and "| 2 | 3 | 0 |" in result.stdout
    saved = load_report.load_run(out / "results.json")
    assert [s["concurrency"] for s in saved["levels"]] == [1, 2] and saved["meta"]["label"] == "fake"
    assert saved["meta"]["num_requests"] == 3 and saved["meta"]["prompts"] == "suite quick"
    assert (out / "report.md").is_file() and (out / "throughput.png").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--concurrency", "1,x"], "'x' is not a valid int"),
        (["--concurrency", "0,2"], "--concurrency"),
        (["--requests", "0"], "--requests"),
        (["--suite", "nope"], "unknown suite"),
        (["--url", "http://127.0.0.1:{port}"], "cannot reach http://127.0.0.1:"),
        (["--url", "http://x", "--serve-args", "--draft ngram"], "--serve-args"),
        (["--compare", "{tmp}"], "at least two RESULTS"),
        # the soak (--duration) and its options
        (["--duration", "1"], "--duration runs one concurrency level"),  # the default 1,2,4,8
        (["--duration", "1", "--concurrency", "2,4"], "got 2,4"),
        (["--duration", "0"], "--duration"),
        (["--duration", "1", "--concurrency", "2", "--keystrokes"], "--keystrokes"),
        (["--duration", "1", "--concurrency", "2", "--server-pid", "1"], "--server-pid goes with"),
        (["--url", "http://x", "--concurrency", "2", "--server-pid", "1"], "--server-pid goes with"),
        (["--prompts", "{tmp}/none.jsonl"], "prompt file not found"),
    ],
)
def test_cli_bad_input(args, message, tmp_path):
    args = [a.format(port=serve_process.free_port(), tmp=tmp_path) for a in args]
    result = CliRunner().invoke(main, ["bench-serve", "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.slow  # starts `draftwise serve` as a process and waits for its model (13 s on 2 loaded cores)
def test_cli_starts_draftwise_serve_and_stops_it(tiny_gguf_dir, tmp_path):
    pytest.importorskip("llama_cpp")
    serve_args = f"--target {tiny_gguf_dir / 'target.gguf'} --draft ngram --n-ctx 4096 --threads 1"
    result = CliRunner().invoke(
        main,
        [
            "bench-serve",
            "--serve-args",
            serve_args,
            "--concurrency",
            "1,2",
            "--requests",
            "2",
            "--max-tokens",
            "8",
            "--suite",
            "chat",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    saved = load_report.load_run(tmp_path)
    assert saved["meta"]["serve_command"].startswith("draftwise serve --target ")
    assert saved["meta"]["server"]["models"] == ["target.gguf"]
    assert all(s["num_errors"] == 0 and s["num_tokens"] > 0 for s in saved["levels"])
    with pytest.raises(httpx.TransportError):  # stopped at the end
        httpx.get(f"{saved['meta']['server']['url']}/health", timeout=2)


def test_started_server_that_exits_shows_its_output():
    with pytest.raises(load.LoadError, match=r"exited with status 2(.|\n)*neither a known name"):
        with serve_process.ServeProcess(["--target", "/no/such/model.gguf"], startup_timeout_s=60):
            pass


def _run(label: str, levels: dict[int, tuple[float, float]]) -> dict:
    return {
        "format": load.FORMAT,
        "meta": {"label": label, "server": {"url": "http://x"}},
        "levels": [
            {"concurrency": c, "tokens_per_second": tps, "ttft_p95_s": ttft} for c, (tps, ttft) in levels.items()
        ],
    }


def test_compare_table_and_cli(tmp_path):
    runs = [
        _run("draftwise", {1: (100.0, 0.2), 4: (300.0, 0.4)}),
        _run("llama-server", {1: (50.0, 0.1), 2: (80.0, 0.3)}),
    ]
    lines = load_report.compare_markdown(runs).splitlines()
    assert lines[0] == (
        "| C | draftwise tok/s | draftwise TTFT p95 s | llama-server tok/s | llama-server TTFT p95 s "
        "| llama-server/draftwise tok/s | llama-server/draftwise TTFT p95 |"
    )
    assert lines[2:] == [
        "| 1 | 100.0 | 0.200 | 50.0 | 0.100 | 0.50x | 0.50x |",
        "| 2 | - | - | 80.0 | 0.300 | - | - |",
        "| 4 | 300.0 | 0.400 | - | - | - | - |",
    ]
    for i, run in enumerate(runs):
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "results.json").write_text(json.dumps(run))
    result = CliRunner().invoke(
        main, ["bench-serve", "--compare", str(tmp_path / "r0"), str(tmp_path / "r1"), "--out", str(tmp_path / "cmp")]
    )
    assert result.exit_code == 0, result.output
    assert "| 1 | 100.0 | 0.200 | 50.0 | 0.100 | 0.50x | 0.50x |" in result.stdout
    assert (tmp_path / "cmp" / "compare.md").read_text() == load_report.compare_markdown(runs)


# --- soak (--duration): RSS sampled over time, a flat verdict once warm -----------------------------------------


@pytest.mark.parametrize(
    "samples, warm_s, flat, max_dev, min_dev",
    [
        # flat: the warm-up's growth (0-300 s) does not count; afterwards within 5% of the 300 s value
        ([(0, 500), (150, 900), (300, 1000), (600, 1030), (900, 980), (1800, 1049)], 300, True, 4.9, -2.0),
        # growing: a slow leak that passes 5% by the end
        ([(0, 1000), (300, 1000), (600, 1020), (900, 1040), (1200, 1060), (1800, 1090)], 300, False, 9.0, 0.0),
        # a spike: one sample 8% above, back to normal after
        ([(300, 1000), (600, 1080), (900, 1000), (1200, 1001)], 300, False, 8.0, 0.0),
        # shrinking past 5% is not flat either
        ([(0, 1000), (60, 1000), (120, 900)], 0, False, 0.0, -10.0),
    ],
)
def test_rss_verdict(samples, warm_s, flat, max_dev, min_dev):
    v = load.rss_verdict(samples, warm_s)
    assert v["flat"] is flat
    assert v["rss_max_dev_pct"] == pytest.approx(max_dev) and v["rss_min_dev_pct"] == pytest.approx(min_dev)
    first_warm = next((t, mb) for t, mb in samples if t >= warm_s)
    assert (v["rss_warm_t_s"], v["rss_warm_mb"]) == first_warm and v["rss_end_mb"] == samples[-1][1]
    assert v["num_samples"] == len(samples) and v["num_samples_after_warm"] == sum(t >= warm_s for t, _ in samples)


def test_rss_verdict_without_enough_samples_after_warm_up_is_none():
    assert load.rss_verdict([], 300)["flat"] is None
    early = load.rss_verdict([(0, 900), (100, 1000)], 300)
    assert early["flat"] is None and early["rss_warm_mb"] is None and early["rss_end_mb"] == 1000
    one = load.rss_verdict([(0, 900), (300, 1000)], 300)
    assert one["flat"] is None and one["rss_warm_mb"] == 1000


def test_soak_summary_passes_only_flat_and_without_failures():
    flat = [(0, 100), (1, 101)]
    ok = load.RequestRecord(1, 0, True, 200, None, 0.1, 0.2, 8, True, None, None)
    failed = load.RequestRecord(1, 1, False, 503, "busy", None, 0.1, 0, False, None, None)
    assert load.soak_summary([ok], flat, 0)["passed"] is True
    both = load.soak_summary([ok, failed], flat, 0)
    assert (both["num_requests"], both["num_ok"], both["num_errors"], both["flat"], both["passed"]) == (
        2,
        1,
        1,
        True,
        False,
    )
    assert load.soak_summary([ok], [(0, 100), (1, 200)], 0)["passed"] is False
    assert load.soak_summary([ok], [], 0)["passed"] is None  # RSS not judged


def test_rss_sampler_samples_this_process():
    with load.RssSampler(os.getpid(), every_s=0.05) as sampler:
        time.sleep(0.3)
    assert len(sampler.samples) >= 3 and sampler.error is None
    assert all(mb > 1 for _, mb in sampler.samples)
    times = [t for t, _ in sampler.samples]
    assert times == sorted(times) and times[0] < 0.05


def test_soak_sends_until_the_time_is_up_and_samples_rss(fake):
    # NOTE: the fake server runs in this process, so its RSS is this process's.
    prompts = ["ok one", ("ok two", 5), "fail-503", "ok three"]
    before = len(fake.app.state.fake["bodies"])
    out = load.run_soak(
        fake.url, prompts, 2, 2.0, server_pid=os.getpid(), rss_every_s=0.25, warm_s=0, seed=3, max_tokens=16
    )
    soak, records = out["soak"], out["records"]
    assert out["levels"][0]["concurrency"] == 2 and out["meta"]["num_requests"] == len(records) >= 8
    assert len(soak["samples"]) >= 3 and soak["server_pid"] == os.getpid() and soak["rss_error"] is None
    assert [r["index"] for r in records] == list(range(len(records)))
    assert all(r["started_s"] is not None and r["started_s"] < 2.0 for r in records)
    # each client goes through every prompt once a round
    assert {r["prompt"] for r in records} == {0, 1, 2, 3}
    assert all(r["ok"] == (r["prompt"] != 2) for r in records)
    s = soak["summary"]
    assert s["num_requests"] == len(records) and s["num_errors"] == sum(r["prompt"] == 2 for r in records) > 0
    assert s["rss_warm_mb"] == soak["samples"][0][1] and s["rss_end_mb"] == soak["samples"][-1][1]
    assert s["flat"] in (True, False) and s["passed"] is False  # failed requests
    # the prompt's own max_tokens goes into its requests
    bodies = fake.app.state.fake["bodies"][before:]
    assert {b["max_tokens"] for b in bodies if b["messages"][0]["content"] == "ok two"} == {5}


def test_soak_order_is_seeded():
    with FakeServer(fake_app(piece_delay_s=0)) as server:

        def order(seed):
            out = load.run_soak(server.url, ["a", "b", "c", "d", "e"], 1, 0.3, seed=seed)
            return [r["prompt"] for r in out["records"]][:5]

        first = order(1)
        assert sorted(first) == [0, 1, 2, 3, 4]  # one round: each prompt once
        assert order(1) == first


def test_soak_of_a_process_that_is_not_there_is_a_clear_error(fake):
    with pytest.raises(load.LoadError, match="cannot read the memory of process"):
        load.run_soak(fake.url, ["hi"], 1, 0.1, server_pid=2**22 + 12345)


def test_cli_soak_with_prompt_file_writes_the_verdict_and_the_plot(fake, tmp_path):
    from draftwise.bench.suites.prompts import Prompt

    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text(
        '{"question_id": 1, "category": "chat", "turns": ["ok short"]}\n'
        '{"question_id": 2, "category": "code", "turns": ["ok long", "second turn"], "max_tokens": 5}\n'
    )
    before = len(fake.app.state.fake["bodies"])
    out = tmp_path / "soak"
    result = CliRunner().invoke(
        main,
        [
            "bench-serve",
            "--url",
            fake.url,
            "--prompts",
            str(prompts_file),
            "--concurrency",
            "2",
            "--duration",
            "0.05",
            "--rss-every",
            "0.5",
            "--warm-minutes",
            "0",
            "--server-pid",
            str(os.getpid()),
            "--max-tokens",
            "8",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "soak: " in result.stdout and "0 failed" in result.stdout
    saved = load_report.load_run(out)
    soak = saved["soak"]
    assert saved["meta"]["prompts"] == str(prompts_file) and saved["meta"]["num_prompts"] == 2
    assert len(soak["samples"]) >= 2 and soak["rss_every_s"] == 0.5 and soak["summary"]["warm_s"] == 0
    assert soak["summary"]["num_errors"] == 0 and soak["summary"]["num_ok"] == len(saved["records"])
    assert soak["summary"]["passed"] is soak["summary"]["flat"]
    bodies = fake.app.state.fake["bodies"][before:]
    assert {b["messages"][0]["content"] for b in bodies} == {"ok short", "ok long"}  # first turns only
    own = {5} if "max_tokens" in Prompt.__dataclass_fields__ else {8}
    assert {b["max_tokens"] for b in bodies[1:] if b["messages"][0]["content"] == "ok long"} == own
    text = (out / "report.md").read_text()
    assert "## Soak" in text and "| failed requests | 0 |" in text and "![](rss.png)" in text
    assert (out / "rss.png").read_bytes().startswith(b"\x89PNG")


def test_cli_soak_without_server_pid_says_rss_is_not_sampled(fake, tmp_path):
    result = CliRunner().invoke(
        main,
        ["bench-serve", "--url", fake.url, "--suite", "chat", "--concurrency", "1", "--duration", "0.01"]
        + ["--out", str(tmp_path)],
    )
    assert result.exit_code == 0, result.output
    assert "RSS is not sampled" in result.stderr
    saved = load_report.load_run(tmp_path)
    assert saved["soak"]["samples"] == [] and saved["soak"]["summary"]["flat"] is None
    assert "RSS not sampled" in (tmp_path / "report.md").read_text() and (tmp_path / "rss.png").is_file()


@pytest.mark.slow  # starts `draftwise serve` as a process and samples its memory (9-18 s on 2 loaded cores)
def test_cli_soak_samples_the_server_it_starts(tiny_gguf_dir, tmp_path):
    pytest.importorskip("llama_cpp")
    serve_args = f"--target {tiny_gguf_dir / 'target.gguf'} --draft ngram --n-ctx 4096 --threads 1"
    result = CliRunner().invoke(
        main,
        ["bench-serve", "--serve-args", serve_args, "--concurrency", "1", "--duration", "0.05", "--rss-every", "0.5"]
        + ["--warm-minutes", "0", "--max-tokens", "8", "--suite", "chat", "--out", str(tmp_path)],
    )
    assert result.exit_code == 0, result.output
    soak = load_report.load_run(tmp_path)["soak"]
    assert soak["server_pid"] is not None and soak["rss_error"] is None and len(soak["samples"]) >= 2
    assert all(mb > 1 for _, mb in soak["samples"]) and soak["summary"]["num_errors"] == 0
