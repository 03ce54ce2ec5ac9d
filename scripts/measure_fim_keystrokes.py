#!/usr/bin/env python
"""Keystroke latency of /infill: replay a user typing one line, a request per `--every` characters.

Serves the target in-process (uvicorn on loopback, as `draftwise serve`), then for each mode sends
the editor's requests one after another as llama.vim builds them (input_prefix: the lines above,
prompt: the typed part of the line, input_suffix: the rest of the file, input_extra: one other
file; n_predict 64, n_indent, greedy). Modes: spec (the server's drafters, auto policy) and plain
(speculation off), each with the cache warm (kept between keystrokes) and cold (every slot's
cache cleared before each request). Prints one JSON line per request and a summary per mode.

    scripts/measure_fim_keystrokes.py [--target M] [--draft ngram,suffix] [--every 2] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import httpx
import uvicorn

from draftwise.loading import LoadOptions, load_engine
from draftwise.models import DEFAULT_TARGET
from draftwise.server import create_app
from draftwise.server.errors import uvicorn_options

ABOVE = '''import math


def distance(p, q):
    """Euclidean distance between two points."""
    return math.sqrt((p[0] - q[0]) ** 2 + (p[1] - q[1]) ** 2)


def closest_pair(points):
    """The two points of the list nearest to each other."""
    best = None
    for i, p in enumerate(points):
        for q in points[i + 1:]:
            d = distance(p, q)
'''
TYPED = "            if best is None or d < best[0]:"
BELOW = """
    return best[1], best[2]


if __name__ == "__main__":
    print(closest_pair([(0, 0), (5, 5), (1, 1)]))
"""
EXTRA = [
    {"filename": "geometry.py", "text": "def midpoint(p, q):\n    return ((p[0] + q[0]) / 2, (p[1] + q[1]) / 2)\n"}
]


def serve(engine):
    app = create_app(engine, "target")
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, log_level="warning", **uvicorn_options())
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


def replay(url: str, engine, *, spec: bool, cold: bool, every: int) -> list[dict]:
    rows = []
    for n in range(every, len(TYPED) + 1, every):
        if cold:
            with engine.lock:
                for i in range(engine.num_slots):
                    engine.slot(i).target.reset()
        prompt = TYPED[:n]
        body = {
            "input_prefix": ABOVE,
            "prompt": prompt,
            "input_suffix": TYPED[n:] + BELOW,
            "input_extra": EXTRA,
            "n_predict": 64,
            "n_indent": len(prompt) - len(prompt.lstrip()),
            "samplers": ["temperature"],
            "temperature": 0.0,
            "cache_prompt": True,
            "t_max_prompt_ms": 500,
            "t_max_predict_ms": 3000,
            "speculation": {"enabled": spec},
        }
        t0 = time.perf_counter()
        answer = httpx.post(f"{url}/infill", json=body, timeout=600).json()
        ms = 1000 * (time.perf_counter() - t0)
        t = answer["timings"]
        rows.append(
            {
                "typed": n,
                "latency_ms": round(ms, 1),
                "cache_n": t["cache_n"],
                "prompt_n": t["prompt_n"],
                "prompt_ms": round(t["prompt_ms"], 1),
                "predicted_n": t["predicted_n"],
                "predicted_ms": round(t["predicted_ms"], 1),
                "draft_n": t.get("draft_n", 0),
                "draft_n_accepted": t.get("draft_n_accepted", 0),
                "content": answer["content"],
            }
        )
        print(json.dumps({"spec": spec, "cold": cold, **rows[-1]}), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default="ngram,suffix")
    parser.add_argument("--every", type=int, default=4, help="characters typed between requests")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--modes", default="spec-warm,plain-warm,spec-cold,plain-cold")
    args = parser.parse_args()
    engine = load_engine(args.target, args.draft, options=LoadOptions(threads=args.threads))
    server, url = serve(engine)
    summary = {}
    try:
        # one request first, so calibration and the first fill are in no mode's figures
        replay(url, engine, spec=True, cold=False, every=len(TYPED))
        for mode in args.modes.split(","):
            kind, cache = mode.split("-")
            rows = replay(url, engine, spec=kind == "spec", cold=cache == "cold", every=args.every)
            lat = sorted(r["latency_ms"] for r in rows)
            summary[mode] = {
                "requests": len(rows),
                "median_ms": round(statistics.median(lat), 1),
                "p95_ms": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 1),
                "median_prompt_n": statistics.median(r["prompt_n"] for r in rows),
                "median_prompt_ms": round(statistics.median(r["prompt_ms"] for r in rows), 1),
                "median_predicted_ms": round(statistics.median(r["predicted_ms"] for r in rows), 1),
                "tokens_predicted": sum(r["predicted_n"] for r in rows),
                "contents": len({r["content"] for r in rows}),
            }
    finally:
        server.should_exit = True
    print(json.dumps({"summary": summary}, indent=1))


if __name__ == "__main__":
    main()
