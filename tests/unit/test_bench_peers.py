"""bench-serve side by side: two fake OpenAI-compatible servers of known speeds (the ratio, the rotated order,
a prompt token count that differs), the specs of suites and peers, llama-server's command line, and the CLI
with a tiny `draftwise serve` it starts beside a fake server."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from draftwise.bench.side_by_side import peer_servers, peers, peers_report
from draftwise.bench.side_by_side.peer_servers import PeerSetup, ServerSpec
from draftwise.bench.side_by_side.peers import PeerSuite
from draftwise.cli import main
from draftwise.types import ConfigError
from tests.unit.test_bench_load import FakeServer, sse

NUM_PIECES = 8


def paced_app(
    piece_delay_s: float, prompt_tokens: int = 5, odd_prompt: str | None = None, timings_ms: float | None = None
) -> Starlette:
    """Streams NUM_PIECES one-token pieces piece_delay_s apart and reports usage; a request whose user message
    is odd_prompt is counted as prompt_tokens + 1 prompt tokens (another template's count). With timings_ms,
    the last chunk carries llama-server's timings of timings_ms a token. app.state.fake keeps the arrival
    order of the requests' prompts."""
    state = {"prompts": []}

    async def chat(request):
        body = await request.json()
        prompt = body["messages"][0]["content"]
        state["prompts"].append(prompt)

        async def events():
            for i in range(NUM_PIECES):
                await asyncio.sleep(piece_delay_s)
                yield sse({"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]})
            last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
            if timings_ms is not None:
                last["timings"] = {"predicted_n": NUM_PIECES, "predicted_ms": NUM_PIECES * timings_ms}
            yield sse(last)
            counted = prompt_tokens + (prompt == odd_prompt)
            usage = {"prompt_tokens": counted, "completion_tokens": NUM_PIECES, "total_tokens": counted + NUM_PIECES}
            yield sse({"choices": [], "usage": usage})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "paced", "object": "model"}]})

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


def write_prompts(path, texts) -> str:
    rows = [{"question_id": i + 1, "category": "cat" if i < 2 else "dog", "turns": [t]} for i, t in enumerate(texts)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory):
    """slow (40 ms a token) against fast (10 ms), slow the baseline, on three prompts of two categories; fast
    counts prompt 'b' one token longer."""
    prompts = write_prompts(tmp_path_factory.mktemp("peers") / "p.jsonl", ["a", "b", "c"])
    slow_app, fast_app = paced_app(0.04, timings_ms=40.0), paced_app(0.01, odd_prompt="b", timings_ms=10.0)
    with FakeServer(slow_app) as slow, FakeServer(fast_app) as fast:
        servers = [peers.contender("slow", slow.url, {}), peers.contender("fast", fast.url + "/v1", {})]
        results = peers.run_peers(servers, [PeerSuite("mini", prompts, 16)], baseline="slow")
        yield results, slow.app.state.fake["prompts"], fast.app.state.fake["prompts"]


def test_ratio_is_the_speeds_ratio_per_prompt(side_by_side):
    results, _, _ = side_by_side
    rows = peers_report.ratio_rows(results)
    suite = next(r for r in rows if r["kind"] == "suite")
    fast, slow = suite["cells"]["fast"], suite["cells"]["slow"]
    assert fast["num"] == 3 and slow["num"] == 3
    # the servers' own timings: 40 ms against 10 ms a token, whatever the host's load did to the stream
    assert fast["geomean"] == pytest.approx(4.0) and fast["min"] == pytest.approx(4.0)
    assert slow["geomean"] == pytest.approx(1.0)
    assert slow["tokens_per_second"] == pytest.approx(25.0)
    client = [r["client_decode_tokens_per_second"] for r in results["records"] if r["server"] == "slow"]
    assert all(0 < tps < 30 for tps in client)  # 7 tokens over 7 gaps of at least 40 ms, first to last
    assert [r["category"] for r in rows if r["kind"] == "category"] == ["cat", "dog"]


def test_order_rotates_and_each_prompt_goes_to_every_server(side_by_side):
    results, slow_prompts, fast_prompts = side_by_side
    # the warm-up sends the first prompt to each server first
    assert slow_prompts == ["a", "a", "b", "c"] and fast_prompts == ["a", "a", "b", "c"]
    firsts = [r["server"] for r in results["records"] if r["position"] == 0]
    assert firsts == ["slow", "fast", "slow"]
    assert all(r["ok"] and r["completion_tokens"] == NUM_PIECES for r in results["records"])


def test_report_flags_a_prompt_token_count_that_differs(side_by_side, tmp_path):
    results, _, _ = side_by_side
    found = peers_report.checks(results)
    assert [m["prompt"] for m in found["prompt_tokens_mismatched"]] == [["mini", "cat", 2]]
    assert found["identical_to_baseline"] == {"fast": [3, 3]}
    report = peers_report.write_outputs(results, tmp_path).read_text()
    assert "2 of 3 prompts" in report and "they differ on mini 2" in report
    assert "| mini, 3 prompts, 16 tokens | 1.00 (" in report and "x by category" in report
    assert json.loads((tmp_path / "results.json").read_text())["format"] == peers.FORMAT


def test_specs_parse_and_refuse_clearly():
    assert PeerSuite.parse("edits=code_edit_long,max_tokens=512,limit=6", 128) == PeerSuite(
        "edits", "code_edit_long", 512, None, 6
    )
    assert PeerSuite.parse("sb=x.jsonl,per_category=2", 128) == PeerSuite("sb", "x.jsonl", 128, 2, None)
    with pytest.raises(ConfigError, match="max_tokens=N"):
        PeerSuite.parse("edits=code_edit_long,max_token=512", 128)
    with pytest.raises(ConfigError, match="NAME=SOURCE"):
        PeerSuite.parse("code_edit_long", 128)
    assert ServerSpec.peer("llama-server:ngram-simple") == ServerSpec(
        "llama-server:ngram-simple", kind="llama-server", args=("ngram-simple",)
    )
    assert ServerSpec.peer("llama-server") == ServerSpec("llama-server", kind="llama-server", args=("plain",))
    assert ServerSpec.peer("nodraft=draftwise:--draft none") == ServerSpec(
        "nodraft", kind="draftwise", args=("--draft", "none")
    )
    assert ServerSpec.peer("draftwise:--draft=none").name == "draftwise"
    assert ServerSpec.at_url("ls=http://127.0.0.1:8080/v1").url == "http://127.0.0.1:8080/v1"
    with pytest.raises(ConfigError, match="KIND one of"):
        ServerSpec.peer("vllm")
    with pytest.raises(ConfigError, match="method is one of"):
        ServerSpec.peer("llama-server:ngram-magic")
    with pytest.raises(ConfigError, match="http"):
        ServerSpec.at_url("ls=127.0.0.1:8080")
    assert peers.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]


def test_llama_server_command_selects_the_method(tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text("")
    setup = PeerSetup(target="t.gguf", threads=2, n_ctx=4096, draft_model="d.gguf", llama_server=str(binary))
    plain = peer_servers.llama_server_command(ServerSpec.peer("llama-server"), setup, 9000)
    assert "--spec-type" not in plain and "-md" not in plain
    assert plain[plain.index("-t") + 1] == "2" and plain[plain.index("-m") + 1] == "t.gguf"
    spec = ServerSpec.peer("llama-server:draft-simple --spec-draft-n-max 8")
    draft = peer_servers.llama_server_command(spec, setup, 9000)
    assert draft[draft.index("--spec-type") + 1] == "draft-simple" and draft[draft.index("-md") + 1] == "d.gguf"
    assert draft[-2:] == ["--spec-draft-n-max", "8"]
    with pytest.raises(ConfigError, match="build_llama_server.sh"):
        peer_servers.llama_server_command(ServerSpec.peer("llama-server"), PeerSetup("t.gguf", 2, 4096), 9000)


def test_cli_starts_a_tiny_draftwise_serve_beside_a_fake_server(tiny_gguf_dir, tmp_path):
    pytest.importorskip("llama_cpp")
    with FakeServer(paced_app(0.005)) as fake:
        result = CliRunner().invoke(
            main,
            [
                "bench-serve",
                "--server",
                f"fake={fake.url}",
                "--peer",
                "tiny=draftwise:--draft ngram",
                "--target",
                str(tiny_gguf_dir / "target.gguf"),
                "--threads",
                "1",
                "--peer-suite",
                "chat=chat,max_tokens=8,limit=2",
                "--baseline",
                "tiny",
                "--out",
                str(tmp_path),
            ],
        )
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [s["name"] for s in saved["meta"]["servers"]] == ["fake", "tiny"]
    tiny = saved["meta"]["servers"][1]
    assert tiny["command"].startswith("draftwise serve --target ") and "--draft ngram" in tiny["command"]
    assert "--n-ctx" not in tiny["command"]  # draftwise serve gets only the shared options the command line gave
    records = saved["records"]
    assert len(records) == 4 and all(r["ok"] for r in records)
    assert all(r["prompt_tokens"] for r in records if r["server"] == "tiny")
    assert "| chat, 2 prompts, 8 tokens |" in (tmp_path / "report.md").read_text()
    with pytest.raises(httpx.TransportError):  # stopped at the end
        httpx.get(f"{tiny['url']}/health", timeout=2)


def test_cli_side_by_side_refuses_what_does_not_go_with_it(tmp_path):
    result = CliRunner().invoke(
        main, ["bench-serve", "--server", "a=http://127.0.0.1:1", "--url", "http://x", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2 and "leave out --url" in result.output
    result = CliRunner().invoke(main, ["bench-serve", "--server", "a=http://127.0.0.1:1", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "two or more servers" in result.output
    result = CliRunner().invoke(
        main,
        ["bench-serve", "--server", "a=http://127.0.0.1:1", "--server", "b=http://127.0.0.1:2", "--baseline", "c"],
    )
    assert result.exit_code == 2 and "'c' is not one of a, b" in result.output


def test_a_server_without_timings_is_timed_from_its_first_content_to_its_last():
    fields = dict(suite="s", category="c", question_id=1, position=0, status=200, error=None, prompt_tokens=5)
    fields.update(ttft_s=0.1, latency_s=1.0, num_drafted=None, num_accepted=None, text_sha1="x")
    plain = peers.PeerRecord(server="a", ok=True, completion_tokens=9, decode_s=0.5, **fields)
    assert plain.decode_tokens_per_second == plain.client_decode_tokens_per_second == pytest.approx(16.0)
    timed = peers.PeerRecord(
        server="b",
        ok=True,
        completion_tokens=9,
        decode_s=0.0001,
        server_predicted_n=10,
        server_predicted_ms=400.0,
        **fields,
    )
    assert timed.decode_tokens_per_second == pytest.approx(25.0)  # the answer came in one burst: 80,000 tok/s
    assert timed.client_decode_tokens_per_second == pytest.approx(80000.0)
    failed = peers.PeerRecord(
        server="c",
        ok=False,
        completion_tokens=9,
        decode_s=0.5,
        server_predicted_n=10,
        server_predicted_ms=400.0,
        **fields,
    )
    assert failed.decode_tokens_per_second is None
