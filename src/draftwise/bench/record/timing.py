"""Timing and memory probes for the bench: per-window tokens/s from stream arrivals, RSS.

The engine streams text pieces as tokens are committed; `WindowClock` notes when each
piece arrives and, once the token ids are known, maps window boundaries (every 32
tokens) to times by interpolating over characters, which gives tokens/s per window.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np


def host_info() -> dict:
    """This machine as a figure's reader needs it: platform, Python, CPUs, and where Linux tells,
    the CPU's model and its widest vector extension (amx_tile, avx512f, avx2 or None)."""
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}
    flags = set(fields.get("flags", "").split())
    info["cpu"] = fields.get("model name") or None
    info["isa"] = next((isa for isa in ("amx_tile", "avx512f", "avx2") if isa in flags), None)
    return info


class WindowClock:
    """Arrival times of streamed text, turned into tokens/s over windows of the output."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.times: list[float] = []  # seconds since start, one per piece
        self.chars: list[int] = []  # cumulative characters after each piece

    def piece(self, text: str) -> None:
        self.times.append(time.perf_counter() - self.start)
        self.chars.append((self.chars[-1] if self.chars else 0) + len(text))

    def windows(
        self, token_ids: Sequence[int], decode: Callable[[Sequence[int]], str], decode_start_s: float, window: int = 32
    ) -> list[float | None]:
        """Tokens/s of each full window of `window` tokens (a shorter output: one partial window).

        decode_start_s is when decoding began (after prefill), in seconds since start.
        Boundary token b arrives when the stream has carried len(decode(ids[:b])) characters;
        within one piece (one verification step) characters are spread evenly over the time
        since the previous piece, so a long accepted draft does not give an infinite rate.
        Example: 64 tokens streamed evenly over 2 s after decode_start 0 -> [32.0, 32.0].
        """
        n = len(token_ids)
        if n == 0 or not self.times:
            return []
        bounds = list(range(window, n + 1, window)) or [n]
        xp = np.asarray([0, *self.chars], dtype=float)
        fp = np.asarray([decode_start_s, *self.times], dtype=float)
        keep = np.concatenate([[True], np.diff(xp) > 0])  # np.interp needs increasing x
        xp, fp = xp[keep], fp[keep]
        out = []
        prev_b, prev_t = 0, decode_start_s
        for b in bounds:
            c = len(decode(list(token_ids[:b])))
            t = float(np.interp(c, xp, fp))
            dt = t - prev_t
            out.append(round((b - prev_b) / dt, 2) if dt > 0 else None)
            prev_b, prev_t = b, t
        return out


def step_windows(step_tokens: Sequence[Sequence[int]], window: int) -> Iterator[int]:
    """Per step, the window of `window` output tokens it began in, from each step's tokens committed
    (the first field of step_tokens' entries). Example: committed 3, 1, 5 with window 4 -> 0, 0, 1."""
    position = 0
    for step in step_tokens:
        yield position // window
        position += step[0]


def acceptance_windows(step_tokens: Sequence[Sequence[int]], window: int = 32) -> list[float | None]:
    """Acceptance over the output: per window of `window` output tokens, draft tokens accepted
    over draft tokens verified in the steps that began in it (None: no step there drafted).

    step_tokens holds per step (tokens committed, drafted, accepted), as RequestStats keeps them.
    Example: steps (3, 4, 2), (1, 0, 0), (5, 4, 4) with window 4 -> [0.5, 1.0]: the first step
    begins at token 0, the second at 3 (both window 0), the third at 4 (window 1).
    """
    drafted: dict[int, int] = {}
    accepted: dict[int, int] = {}
    for w, (_, d, a) in zip(step_windows(step_tokens, window), step_tokens):
        drafted[w] = drafted.get(w, 0) + d
        accepted[w] = accepted.get(w, 0) + a
    last = max(drafted, default=-1)
    return [round(accepted[w] / drafted[w], 4) if drafted.get(w) else None for w in range(last + 1)]


def block_rates(windows: Sequence[float | None], window: int, block: int = 512) -> list[float | None]:
    """Tokens/s over blocks of `block` output tokens from per-window rates (time-weighted: a
    block's tokens over the sum of its windows' times). Example: windows [10, 20] of 32 tokens,
    block 64 -> [64 / (3.2 + 1.6)] = [13.33]."""
    per = max(1, block // window)
    out: list[float | None] = []
    for i in range(0, len(windows), per):
        chunk = windows[i : i + per]
        if len(chunk) < per or any(not v for v in chunk):
            out.append(None)
            continue
        out.append(round(window * len(chunk) / sum(window / v for v in chunk), 2))
    return out


def current_rss_mb() -> float:
    """Resident set size of this process now, in MB (file-backed model pages included)."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (it only grows)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


class CompetingLoad:
    """CPU time other processes used while a run went on, as a share of the machine.

    The 1-minute load average counts the bench's own threads (two on a 2-CPU machine read as
    "load 2"), so it cannot tell competition from our own work; this subtracts our process's
    CPU time from the machine's busy time. The probes are injectable for tests.
    """

    def __init__(self, cpu_times=None, own_times=None, cpus: int | None = None, clock=time.perf_counter) -> None:
        import os

        import psutil

        self._cpu_times = cpu_times or psutil.cpu_times
        self._own_times = own_times or (lambda: psutil.Process().cpu_times())
        self._cpus = cpus or os.cpu_count() or 1
        self._clock = clock
        self._start = self._read()

    def _read(self) -> tuple[float, float, float]:
        t = self._cpu_times()
        busy = t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        own = self._own_times()
        return self._clock(), busy, own.user + own.system + own.children_user + own.children_system

    def share(self) -> float:
        """Other processes' CPU time since construction / (wall time x CPUs), in [0, 1]."""
        wall, busy, own = (b - a for a, b in zip(self._start, self._read()))
        if wall <= 0:
            return 0.0
        return min(1.0, max(0.0, (busy - own) / (wall * self._cpus)))
