"""What a second OpenMP team costs llama.cpp's one-row forward (compute_thread.py): the same model's
one-row forwards on a worker thread, in a process where that worker's team is the only one
("one team", what `draftwise serve` does since a13346f) and in one where the main thread computed
first and keeps its team ("two teams", what it did before: the load and calibration ran on the
main thread). Each arrangement runs in a fresh process of its own (a team lasts as long as its
thread), alternating, `rounds` times; a figure is the median forward of a process, and the result
their medians. Run it on a quiet machine, e.g. under `chrt -f 50` (docs/bench/serve-peers).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ARRANGEMENTS = ("one team", "two teams")


@dataclass(frozen=True)
class OpenMPTeams:
    model: str
    threads: int
    rounds: int
    forwards: int  # timed one-row forwards per process
    one_team_ms: tuple[float, ...]  # each process's median one-row forward
    two_teams_ms: tuple[float, ...]
    one_team_median_ms: float
    two_teams_median_ms: float
    slowdown: float  # two teams' median over one team's


def forwards_in_process(model: str, threads: int, forwards: int, main_first: bool, n_ctx: int = 1024) -> float:
    """The median one-row forward (ms) on a worker thread of this process, after the main thread
    ran forwards of its own first (main_first) or never did. Called in a fresh process."""
    import threading
    import time

    from draftwise.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(Path(model), n_ctx=n_ctx, n_threads=threads)
    times: list[float] = []

    def run(n: int, out: list[float] | None) -> None:
        backend.truncate(0)
        backend.extend(list(range(10, 74)))  # a 64-token context
        for i in range(n):
            t0 = time.perf_counter()
            backend.extend([100 + i % 50])
            if out is not None:
                out.append(1000 * (time.perf_counter() - t0))

    try:
        if main_first:
            run(4, None)  # the main thread's team now exists and lives on
        worker = threading.Thread(target=run, args=(forwards, times))
        worker.start()
        worker.join()
    finally:
        backend.close()
    return statistics.median(times)


def measure(
    model: str, threads: int = 2, rounds: int = 3, forwards: int = 20, on_run: Callable[[str], None] | None = None
) -> OpenMPTeams:
    """Both arrangements `rounds` times, alternating, each in a fresh Python process."""
    if rounds < 1 or forwards < 1 or threads < 1:
        raise ValueError(f"rounds, forwards and threads must be at least 1, got {rounds}, {forwards}, {threads}")
    if not Path(model).is_file():  # a name a store gives it (the registry's, Ollama's, ...)
        from draftwise import stores

        model = str(stores.resolve(model, (), fetch=False).path)
    found: dict[str, list[float]] = {name: [] for name in ARRANGEMENTS}
    for _ in range(rounds):
        for name in ARRANGEMENTS:
            code = (
                "import json, sys; from draftwise.bench.measure.openmp_teams import forwards_in_process as f; "
                "print(json.dumps(f(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == '1')))"
            )
            args = [model, str(threads), str(forwards), "1" if name == "two teams" else "0"]
            done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"the {name} process failed: {done.stderr.strip()[-500:]}")
            found[name].append(round(json.loads(done.stdout.strip().splitlines()[-1]), 2))
            if on_run is not None:
                on_run(name)
    one, two = statistics.median(found["one team"]), statistics.median(found["two teams"])
    return OpenMPTeams(
        model=str(model),
        threads=threads,
        rounds=rounds,
        forwards=forwards,
        one_team_ms=tuple(found["one team"]),
        two_teams_ms=tuple(found["two teams"]),
        one_team_median_ms=round(one, 2),
        two_teams_median_ms=round(two, 2),
        slowdown=round(two / one, 3),
    )
