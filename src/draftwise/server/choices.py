"""Several choices per request and their logprobs, in OpenAI's shapes.

A request with `n` > 1, or a /v1/completions `prompt` that is a list of prompts, becomes one
Job per choice (prompt-major: choice index = prompt index * n + copy); the Batcher decodes them
side by side in slots (a slot whose cache holds the prompt is preferred), and the queue takes
the rest in arrival order. Logprobs are the target's raw log-softmax (sampling.logprobs).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np

from draftwise.sampling import TokenLogprob
from draftwise.server.errors import APIError


def prompts(prompt: Any, vocab_size: int) -> list[tuple[str | None, list[int] | None]]:
    """OpenAI's prompt forms (text, texts, token ids, lists of token ids) -> [(text, None) or (None, ids)]."""
    items = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else [prompt]
    out: list[tuple[str | None, list[int] | None]] = []
    for item in items:
        if isinstance(item, str):
            out.append((item, None))
            continue
        bad = next((t for t in item if t >= vocab_size), None)
        if bad is not None:
            raise APIError(
                400,
                f"token id {bad} is outside the vocabulary (size {vocab_size})",
                param="prompt",
                code="invalid_value",
            )
        out.append((None, list(item)))
    return out


def choice_seed(seed: int | None, copy: int) -> int | None:
    """Choice `copy`'s seed: the request's for the first, an independent stream for the others."""
    if seed is None or copy == 0:
        return seed
    return int(np.random.SeedSequence([seed, copy]).generate_state(1, np.uint64)[0])


def best(done: Sequence[Any], best_of: int, n: int) -> list[Any]:
    """Completions' best_of: of each prompt's best_of candidates (prompt-major), the n with the
    highest mean logprob per token (OpenAI's "highest log probability per token"; an empty
    answer counts 0), best first, ties in candidate order. best_of == n: done as it is."""
    if best_of <= n:
        return list(done)

    def mean(d) -> float:
        entries = d.result.logprobs or []
        return sum(e.logprob for e in entries) / len(entries) if entries else 0.0

    picked = []
    for start in range(0, len(done), best_of):
        group = list(done[start : start + best_of])
        order = sorted(range(len(group)), key=lambda i: (-mean(group[i]), i))
        picked += [group[i] for i in order[:n]]
    return picked


def _piece(tokenizer, token: int) -> str:
    return tokenizer.decode([token])


def completion_logprobs(
    tokenizer, entries: Sequence[TokenLogprob | None], tokens: Sequence[int], num_top: int, offset: int = 0
) -> dict:
    """OpenAI's completions logprobs: tokens, token_logprobs, top_logprobs, text_offset (an entry
    None: a token with no logprob, the first of an echoed prompt)."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, entry in zip(tokens, entries):
        text = _piece(tokenizer, token)
        out["tokens"].append(text)
        out["text_offset"].append(offset)
        offset += len(text)
        out["token_logprobs"].append(None if entry is None else entry.logprob)
        out["top_logprobs"].append(
            None if entry is None else {_piece(tokenizer, t): lp for t, lp in entry.top[:num_top]}
        )
    return out


def chat_logprobs(tokenizer, entries: Sequence[TokenLogprob]) -> dict:
    """OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": None}."""

    def one(token: int, logprob: float) -> dict:
        text = _piece(tokenizer, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {
        "content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries],
        "refusal": None,
    }


async def merged(streams: Sequence[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """(index, event) from several async iterators as they come; closing it closes them all."""
    if len(streams) == 1:
        async for event in streams[0]:
            yield 0, event
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: AsyncIterator[Any]) -> None:
        try:
            async for event in stream:
                await queue.put((i, event))
        finally:
            await queue.put((i, done))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, event = await queue.get()
            if event is done:
                remaining -= 1
                continue
            yield i, event
    finally:
        for task in tasks:
            task.cancel()
