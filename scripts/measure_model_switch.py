"""Several models behind one server (serve --models): time to first token after a switch, and the
memory the process holds, for the registry's small models served together.

It starts the server of several models in this process (create_pool_app under uvicorn, on a free
loopback port), then asks each model in turn for a short streamed chat answer: first cold (the
model loads), then warm, then after switching back and forth. It prints one row per request and
writes them as JSON. The page cache is what it is: run it twice to see warm-file loads.

    python scripts/measure_model_switch.py --out docs/bench/model-switch/switch.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from draftwise import models
from draftwise.loading import LoadOptions, load_engine
from draftwise.server import catalog
from draftwise.server.app import create_pool_app
from draftwise.server.errors import uvicorn_options
from draftwise.types import SpeculationConfig

MODELS = ("qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-0.5b-instruct")
ORDER = (0, 0, 1, 1, 2, 0, 1, 3, 2, 0)  # cold loads, warm repeats, switches back and forth
PROMPT = [{"role": "user", "content": "Name three primary colours."}]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_token(url: str, model: str) -> tuple[float, float]:
    """(seconds to the first streamed text, seconds to the end) of one greedy chat."""
    started = time.monotonic()
    first = None
    body = {"model": model, "messages": PROMPT, "max_tokens": 16, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if first is None and line.startswith("data: {"):
                choices = json.loads(line[len("data: ") :]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    first = time.monotonic() - started
    return first or float("nan"), time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-memory", type=float, default=None, help="the pool's budget in GiB (default: none)")
    args = parser.parse_args()
    options = LoadOptions(n_ctx=2048, threads=args.threads, slots=1)
    speculation = SpeculationConfig(policy="fixed", max_draft_tokens=4)
    for name in MODELS:
        models.resolve(name)  # pulled before anything is timed
    served = catalog.chosen(",".join(MODELS[1:]), MODELS[0])
    sources = catalog.sources(
        served,
        lambda spec: load_engine(spec, "ngram", options=options, speculation=speculation),
        n_ctx=options.n_ctx,
        num_slots=1,
    )
    budget = int(args.max_memory * 2**30) if args.max_memory else None
    app = create_pool_app(sources, keep_alive_s=-1, budget_bytes=budget)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **uvicorn_options()))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    rows, loaded = [], set()
    base = rss_bytes()
    for i in ORDER:
        name = MODELS[i]
        held = {m["name"].removesuffix(":latest") for m in httpx.get(f"{url}/api/ps").json()["models"]}
        kind = "loaded" if name in held else "reload" if name in loaded else "cold"
        ttft, total = first_token(url, name)
        loaded.add(name)
        row = {"model": name, "kind": kind, "ttft_s": round(ttft, 3), "total_s": round(total, 3)}
        row["rss_gib"] = round(rss_bytes() / 2**30, 2)
        rows.append(row)
        print(f"{name:32s} {kind:6s} first token {ttft:7.3f} s  answer {total:7.3f} s  RSS {row['rss_gib']:.2f} GiB")
    ps = httpx.get(f"{url}/api/ps").json()["models"]
    held = {m["name"]: round(m["size"] / 2**30, 2) for m in ps}
    print(
        "loaded (estimated GiB):",
        held,
        f"process RSS {rss_bytes() / 2**30:.2f} GiB (before any model {base / 2**30:.2f})",
    )
    server.should_exit = True
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"host": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "models": MODELS}
        meta["max_memory_gib"] = args.max_memory
        meta["load_avg"] = os.getloadavg()
        args.out.write_text(json.dumps({"meta": meta, "rows": rows, "estimated_gib": held}, indent=1) + "\n")


if __name__ == "__main__":
    main()
