"""The tool_calls suite through the routes agents speak: /v1/chat/completions (openai-python),
/v1/responses (openai-python, as Codex CLI and the Agents SDK call it) and /v1/messages
(anthropic-python, as Claude Code calls it), speculation auto against plain, in one run on one
server.

One server per route (fresh drafters' history), the suite's prompts in order; per prompt one
warm-up request (the prompt enters the cache), then plain and auto back to back, so drift hits
both alike. tok/s is the server's decode speed of that answer
(usage.speculative.tokens_per_second: generated tokens over decode time, prefill excluded);
speedup is auto over plain per prompt, geometric mean per route. Greedy; the answers of plain and
auto are compared (identical) and each call is checked against its tool's schema.

Usage: python scripts/measure_agent_routes.py [--max-tokens 256] [--out docs/bench/tool-calls-routes]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import socket
import subprocess
import threading
import time
from pathlib import Path

SUITE = Path(__file__).resolve().parents[1] / "src/draftwise/bench/suites/tool_calls.jsonl"
PLAIN = {"enabled": False}
AUTO = {"policy": "auto"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(max_tokens: int):
    import uvicorn

    from draftwise import models
    from draftwise.loading import FREE_DRAFTERS, load
    from draftwise.server import create_app

    engine = load(models.DEFAULT_TARGET, ",".join(FREE_DRAFTERS), calibrate=True).engine
    app = create_app(engine, "draftwise")
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}", engine


def _chat(client, record: dict, speculation: dict, max_tokens: int) -> tuple[str, list, dict]:
    kwargs = {"tool_choice": record["tool_choice"]} if "tool_choice" in record else {}
    answer = client.chat.completions.create(
        model="draftwise",
        messages=[{"role": "user", "content": record["turns"][0]}],
        tools=record["tools"],
        temperature=0,
        max_tokens=max_tokens,
        extra_body={"speculation": speculation},
        **kwargs,
    )
    message = answer.choices[0].message
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    return message.content or "", calls, answer.usage.model_extra["speculative"]


def _responses(client, record: dict, speculation: dict, max_tokens: int) -> tuple[str, list, dict]:
    tools = [{"type": "function", **t["function"]} for t in record["tools"]]
    kwargs = {}
    if "tool_choice" in record:
        choice = record["tool_choice"]
        kwargs["tool_choice"] = choice if isinstance(choice, str) else {"type": "function", **choice["function"]}
    answer = client.responses.create(
        model="draftwise",
        input=record["turns"][0],
        tools=tools,
        temperature=0,
        max_output_tokens=max_tokens,
        extra_body={"speculation": speculation},
        **kwargs,
    )
    calls = [(o.name, json.loads(o.arguments)) for o in answer.output if o.type == "function_call"]
    return answer.output_text, calls, answer.usage.model_extra["speculative"]


def _messages(client, record: dict, speculation: dict, max_tokens: int) -> tuple[str, list, dict]:
    tools = [
        {"name": f["name"], "description": f.get("description", ""), "input_schema": f["parameters"]}
        for f in (t["function"] for t in record["tools"])
    ]
    kwargs = {}
    if "tool_choice" in record:
        choice = record["tool_choice"]
        kwargs["tool_choice"] = (
            {"type": "any"} if choice == "required" else {"type": "tool", "name": choice["function"]["name"]}
        )
    answer = client.messages.create(
        model="draftwise",
        messages=[{"role": "user", "content": record["turns"][0]}],
        tools=tools,
        max_tokens=max_tokens,
        extra_body={"speculation": speculation, "temperature": 0},  # the SDK takes no temperature
        **kwargs,
    )
    text = "".join(b.text for b in answer.content if b.type == "text")
    calls = [(b.name, b.input) for b in answer.content if b.type == "tool_use"]
    return text, calls, answer.usage.model_extra["speculative"]


def _valid(calls: list, record: dict) -> bool:
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in record["tools"]}
    return all(
        name in schemas and jsonschema.Draft202012Validator(schemas[name]).is_valid(args) for name, args in calls
    )


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path("docs/bench/tool-calls-routes"))
    args = parser.parse_args()

    import anthropic
    import openai

    records = [json.loads(line) for line in SUITE.read_text().splitlines() if line.strip()]
    routes = {"chat": _chat, "responses": _responses, "messages": _messages}
    rows = []
    for route, call in routes.items():
        # A fresh server per route: the suffix drafter's history holds this route's earlier
        # answers only, as it would for an agent speaking one protocol.
        server, url, _ = _serve(args.max_tokens)
        client = (
            anthropic.Anthropic(base_url=url, api_key="none", timeout=600)
            if route == "messages"
            else openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=600)
        )
        for record in records:
            call(client, record, PLAIN, args.max_tokens)  # warm-up: the prompt enters the cache
            got = {
                mode: call(client, record, spec, args.max_tokens) for mode, spec in (("plain", PLAIN), ("auto", AUTO))
            }
            (pt, pc, ps), (at, ac, as_) = got["plain"], got["auto"]
            rows.append(
                {
                    "question_id": record["question_id"],
                    "route": route,
                    "plain_tok_s": round(ps["tokens_per_second"], 2),
                    "auto_tok_s": round(as_["tokens_per_second"], 2),
                    "speedup": as_["tokens_per_second"] / ps["tokens_per_second"],
                    "num_generated": as_["num_generated"],
                    "acceptance": round(as_["acceptance_rate"], 3),
                    "tokens_per_step": round(as_["tokens_per_step"], 3),
                    "tokens_by_source": as_.get("tokens_by_source", {}),
                    "identical": (pt, pc) == (at, ac),
                    "calls": [name for name, _ in ac],
                    "calls_valid": _valid(pc, record) and _valid(ac, record),
                    "decision": sorted({n for n, _ in ac}) == sorted(set(record["expected_calls"])),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        server.should_exit = True
        time.sleep(1)
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    flags = open("/proc/cpuinfo").read()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "?"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    summary = {}
    for route in routes:
        rs = [r for r in rows if r["route"] == route]
        summary[route] = {
            "n": len(rs),
            "plain_tok_s": round(sum(r["plain_tok_s"] for r in rs) / len(rs), 1),
            "auto_tok_s": round(sum(r["auto_tok_s"] for r in rs) / len(rs), 1),
            "speedup": round(_geomean([r["speedup"] for r in rs]), 3),
            "identical": sum(r["identical"] for r in rs),
            "calls_valid": sum(r["calls_valid"] for r in rs),
            "decision": sum(r["decision"] for r in rs),
        }
    meta = {"host": f"{cpu}, {isa}, {platform.machine()}", "commit": commit, "max_tokens": args.max_tokens}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1))
    lines = [
        "# The tool_calls suite through chat completions, Responses and Messages",
        "",
        f"Host {meta['host']}; commit {commit}; greedy, max_tokens {args.max_tokens}; one fresh server per "
        "route, drafters ngram, suffix, grammar, prediction, calls; per prompt a warm-up, then plain "
        "and auto back to back. `python scripts/measure_agent_routes.py`.",
        "",
        "| route | n | plain tok/s | auto tok/s | speedup (geomean) | identical | calls valid | decision |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for route, s in summary.items():
        n = s["n"]
        lines.append(
            f"| {route} | {n} | {s['plain_tok_s']} | {s['auto_tok_s']} | {s['speedup']:.2f}x | "
            f"{s['identical']}/{n} | {s['calls_valid']}/{n} | {s['decision']}/{n} |"
        )
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
