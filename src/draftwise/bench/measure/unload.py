"""Memory given back after models unload: models loaded, asked for a few tokens and unloaded in
turn through the server's model pool (what `serve --models ... --max-memory` does), the process's
resident memory read after each cycle with every model unloaded: the first cycle's figure is a
fresh server's that loaded each model once, and a leak shows as the last figure above it.

Example: `draftwise measure unload --models qwen2.5-coder-1.5b,smollm2-135m-instruct --cycles 50`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from draftwise.bench.record.timing import current_rss_mb
from draftwise.server.pool import ModelPool, ModelSource
from draftwise.types import ConfigError, SamplingParams

SETTLE_S = 0.2  # between the RSS readings that must agree before one is taken


@dataclass(frozen=True)
class UnloadCycles:
    """RSS in MiB at the end of each cycle: `loaded_mb` with the models the budget kept, then
    `unloaded_mb` with none; `fresh_mb` is the first cycle's unloaded figure, `final_mb` the last's."""

    models: tuple[str, ...]
    num_cycles: int
    budget_bytes: int | None
    fresh_mb: float
    final_mb: float
    loaded_mb: tuple[float, ...]
    unloaded_mb: tuple[float, ...]
    seconds: float

    @property
    def growth(self) -> float:
        """final / fresh: 1.0 when unloading gives everything back."""
        return self.final_mb / self.fresh_mb


def unload_cycles(
    sources: Sequence[ModelSource],
    make_state: Callable,
    *,
    num_cycles: int,
    budget_bytes: int | None = None,
    max_tokens: int = 4,
    on_cycle: Callable[[int, float, float], None] | None = None,
) -> UnloadCycles:
    """num_cycles times: load each source in turn for a greedy request of max_tokens (the pool
    unloading the least recently used idle model when the next would not fit budget_bytes), then
    unload every model. on_cycle(cycle, loaded_mb, unloaded_mb) follows each cycle."""
    if num_cycles < 1:
        raise ValueError(f"num_cycles must be >= 1, got {num_cycles}")
    return asyncio.run(_run(sources, make_state, num_cycles, budget_bytes, max_tokens, on_cycle))


async def _run(sources, make_state, num_cycles, budget_bytes, max_tokens, on_cycle) -> UnloadCycles:
    pool = ModelPool(sources, make_state, budget_bytes=budget_bytes, keep_alive_s=-1)
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    started, loaded, unloaded = time.monotonic(), [], []
    try:
        for cycle in range(1, num_cycles + 1):
            for source in sources:  # the budget unloads the least recently used to fit the next
                async with pool.use(source.name) as state:
                    await asyncio.to_thread(state.engine.generate, "def add(a, b):", sampling=sampling)
            loaded.append(await _settled_rss())
            unloaded.append(await _unload_all(pool))
            if on_cycle is not None:
                on_cycle(cycle, loaded[-1], unloaded[-1])
    finally:
        pool.close()
    return UnloadCycles(
        models=tuple(s.name for s in sources),
        num_cycles=num_cycles,
        budget_bytes=budget_bytes,
        fresh_mb=unloaded[0],
        final_mb=unloaded[-1],
        loaded_mb=tuple(loaded),
        unloaded_mb=tuple(unloaded),
        seconds=round(time.monotonic() - started, 1),
    )


async def _unload_all(pool: ModelPool) -> float:
    """Unload every loaded model (a request with keep_alive 0 each, as `ollama stop` sends), wait
    for their memory to be freed, and read the RSS."""
    for model in pool.loaded():
        async with pool.use(model.name, keep_alive_s=0):
            pass
    await pool.closed()
    return await _settled_rss()


async def _settled_rss(attempts: int = 20) -> float:
    """The RSS once two readings SETTLE_S apart agree within 1 MiB (a freed buffer's pages leave
    over a moment), else the last reading."""
    before = current_rss_mb()
    for _ in range(attempts):
        await asyncio.sleep(SETTLE_S)
        now = current_rss_mb()
        if abs(now - before) < 1.0:
            return round(now, 1)
        before = now
    return round(before, 1)


def sources(models: str, draft: str, n_ctx: int = 4096, threads: int | None = None) -> list[ModelSource]:
    """The named models (comma-separated registry names or GGUF files) as `serve --models` makes
    them: its catalog, load_engine with `draft`'s drafters, default slots."""
    from draftwise.loading import DEFAULT_SLOTS, LoadOptions, load_engine
    from draftwise.server import catalog

    names = [n.strip() for n in models.split(",") if n.strip()]
    if not names:
        raise ConfigError("--models names no model")
    options = LoadOptions(n_ctx=n_ctx, threads=threads, slots=0)
    served = catalog.chosen(",".join(names), names[0])

    def load(spec: str):
        return load_engine(spec, draft, options=options)

    return catalog.sources(served, load, n_ctx=n_ctx, num_slots=DEFAULT_SLOTS)


def make_state(name, engine):
    from draftwise.server.app import model_state

    return model_state(name, engine)
