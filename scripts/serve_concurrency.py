"""Time to first token and tokens/s for N concurrent streaming chat clients.

Starts nothing itself: point it at a running `draftwise serve` (default loopback:8000).

    draftwise serve --draft ngram &
    python scripts/serve_concurrency.py --clients 4 --max-tokens 128
"""

import argparse
import asyncio
import json
import time

from openai import AsyncOpenAI

PROMPTS = [
    "Write a Python function that merges two sorted lists.",
    "Explain what a mutex is in three sentences.",
    "Convert to JSON with keys name and age: Bob is 42.",
    "Write a haiku about compilers.",
]


async def one(client, model, prompt, max_tokens):
    t0 = time.perf_counter()
    first, chunks, usage = None, 0, None
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
    end = time.perf_counter()
    tokens = usage.completion_tokens if usage else chunks
    return {
        "ttft_s": round(first - t0, 3),
        "total_s": round(end - t0, 3),
        "tokens": tokens,
        "client_tokens_per_s": round(tokens / (end - first), 1),
        "speculative": (usage.model_extra or {}).get("speculative") if usage else None,
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    client = AsyncOpenAI(base_url=args.base_url, api_key="none")
    model = (await client.models.list()).data[0].id
    t0 = time.perf_counter()
    results = await asyncio.gather(
        *(one(client, model, PROMPTS[i % len(PROMPTS)], args.max_tokens) for i in range(args.clients))
    )
    wall = time.perf_counter() - t0
    for r in results:
        spec = r.pop("speculative") or {}
        print(
            json.dumps(
                {
                    **r,
                    "engine_tokens_per_second": round(spec.get("tokens_per_second", 0), 1),
                    "acceptance_rate": round(spec.get("acceptance_rate", 0), 2),
                    "tokens_per_step": round(spec.get("tokens_per_step", 0), 2),
                }
            )
        )
    total = sum(r["tokens"] for r in results)
    print(f"{args.clients} clients: {total} tokens in {wall:.1f} s = {total / wall:.1f} tok/s aggregate")
    print("last request usage.speculative:", json.dumps(spec))


if __name__ == "__main__":
    asyncio.run(main())
