"""compute_thread: one-off llama.cpp compute on a thread that ends with it leaves no OpenMP team
behind (a team kept by another thread makes libgomp throttle every barrier of the serving one)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from draftwise.compute_thread import in_passing_thread, in_passing_thread_async


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def settled_threads(expected: int) -> int:
    """The thread count once it reaches expected, or after 5 s (a thread that Python has let go
    may still be running its exit, libgomp's pool release among it)."""
    deadline = time.monotonic() + 5
    while os_threads() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return os_threads()


def openmp_build() -> bool:
    import llama_cpp

    return "OPENMP = 1" in llama_cpp.llama_print_system_info().decode()


def forward(backend) -> None:
    backend.reset()
    backend.extend([1, 2, 3, 4])


def test_results_and_errors_come_back_to_the_caller():
    assert in_passing_thread(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(KeyError, match="gone"):
        in_passing_thread(lambda: {}["gone"])
    assert asyncio.run(in_passing_thread_async(lambda x: x * 2, 21)) == 42
    with pytest.raises(ValueError, match="bad"):
        asyncio.run(in_passing_thread_async(lambda: (_ for _ in ()).throw(ValueError("bad"))))
    names = []
    in_passing_thread(lambda: names.append(threading.current_thread().name))
    assert names == ["draftwise-load"] and threading.current_thread().name != "draftwise-load"


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_a_passing_thread_takes_its_openmp_team_with_it(tiny_gguf_dir):
    from draftwise.backends.llamacpp import LlamaCppBackend

    if not openmp_build():
        pytest.skip("llama.cpp built without OpenMP: no teams to leave behind")
    backend = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=64, n_threads=2)
    try:
        before = os_threads()
        in_passing_thread(forward, backend)
        assert settled_threads(before) == before  # the team's worker ended with the thread
        # The control: a pooled thread that lives on keeps its team (asyncio.to_thread's way).
        with ThreadPoolExecutor(1) as pool:
            pool.submit(forward, backend).result()
            assert os_threads() >= before + 2  # the pooled thread and its team's worker
        assert settled_threads(before) == before
    finally:
        backend.close()
