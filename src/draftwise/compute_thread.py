"""Where a long-lived process runs llama.cpp's one-off compute: on a thread that ends with it.

llama.cpp's CPU backend (built with OpenMP, as llama-cpp-python builds it) runs each forward on a
team of OpenMP threads that belongs to the thread calling it, and libgomp keeps a team for as long
as that thread lives. While the process holds more OpenMP threads than it has CPUs, libgomp
spins only 100 times at a barrier before it sleeps in the kernel (its "throttled" spin count, in
place of about 300,000), and a forward crosses hundreds of barriers. So a server that loaded and
calibrated its model on the main thread and decodes on its engine thread held two teams, three
OpenMP threads on a 2-core host, and every one-row forward paid a sleep and a wake per barrier:
43-65 ms against 37.6 calibrated in the same process on a 2-core AMD EPYC (issue 68).

Compute that runs once (loading, the cost calibration, a warm-up) goes through
`in_passing_thread`, whose thread ends when it returns and takes its team with it; decoding runs
on the serving worker's one thread (server/serving.py), which ends its team when it idles.

Example:
    engine = in_passing_thread(load_engine, "qwen2.5-coder-1.5b-instruct", "ngram")
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def in_passing_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) on a new thread that ends when it returns: its result, or its
    exception raised here. The caller waits (a KeyboardInterrupt still reaches the caller)."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((True, fn(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="draftwise-load", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)  # in short waits: Ctrl+C is seen by the main thread meanwhile
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


async def in_passing_thread_async(fn: Callable[..., T], *args, **kwargs) -> T:
    """in_passing_thread for the event loop: awaits fn's thread without blocking the loop (where
    asyncio.to_thread would run it on a pooled thread that lives on, and its OpenMP team with it)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(ok: bool, value) -> None:
        if done.cancelled():
            return
        if ok:
            done.set_result(value)
        else:
            done.set_exception(value)

    def run() -> None:
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, False, exc)
        else:
            loop.call_soon_threadsafe(settle, True, result)

    threading.Thread(target=run, name="draftwise-load", daemon=True).start()
    return await done
