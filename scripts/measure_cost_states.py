"""What a forward over n rows costs relative to one row, over time, in one process: groups of
calibration-style timings (each size `--rounds` times, interleaved, the fastest kept: the
rounds of calibrate.measure_grid) back to back, then after an idle pause, then back to back again.
On a shared host the price of many rows against one moves between states that last seconds to
minutes (docs/design.md section 7); this prints each group's price in plain steps so the states
can be seen, and the hypervisor's steal time beside them.

Usage: python scripts/measure_cost_states.py [--target MODEL] [--n-ctx 32768] [--context 1024]
       [--groups 6] [--pause 30] [--after 8]
"""

from __future__ import annotations

import argparse
import json
import time

from draftwise import models
from draftwise.calibrate import _context_ids, _time_sizes
from draftwise.loading import LoadOptions, load_backend

SIZES = (1, 4, 16, 64)


def steal_ticks() -> int:
    """The hypervisor's steal time so far (/proc/stat, clock ticks); 0 where it is not kept."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) if len(fields) > 8 else 0
    except OSError:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=models.DEFAULT_TARGET)
    parser.add_argument("--n-ctx", type=int, default=32768)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--groups", type=int, default=6, help="groups before the pause")
    parser.add_argument("--pause", type=float, default=30.0, help="idle seconds between the two series")
    parser.add_argument("--after", type=int, default=8, help="groups after the pause")
    args = parser.parse_args()
    start = time.perf_counter()
    backend = load_backend(args.target, LoadOptions(n_ctx=args.n_ctx))
    backend.prefill(_context_ids(args.context, backend.vocab_size))

    def group() -> dict:
        steal = steal_ticks()
        times: dict[int, list[float]] = {n: [] for n in SIZES}
        for _ in range(args.rounds):
            _time_sizes(backend, SIZES, args.context, times)
        best = {n: min(v) for n, v in times.items()}
        row = {
            "t_s": round(time.perf_counter() - start, 1),
            "ms": {n: round(v, 1) for n, v in best.items()},
            "plain_steps": {n: round(v / best[1], 2) for n, v in best.items() if n > 1},
            "steal_ticks": steal_ticks() - steal,
        }
        print(json.dumps(row), flush=True)
        return row

    for _ in range(args.groups):
        group()
    time.sleep(args.pause)
    for _ in range(args.after):
        group()
    backend.close()


if __name__ == "__main__":
    main()
