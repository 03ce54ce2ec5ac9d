"""Several models behind one server: `ModelPool` loads a model when a request names it, keeps it
for its keep-alive, and unloads the least recently used idle one when the next would not fit the
memory budget. A model's requests hold it (`use`) for their whole life, streams included, so a
model is unloaded only once idle; requests for a model being loaded wait for that one load.

Everything here runs on the server's event loop (loads and unloads in worker threads), so the
bookkeeping needs no lock: nothing awaits between a check and the change it decides.
Example: `async with pool.use("qwen2.5-coder:7b", keep_alive_s=300) as state: ...`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from draftwise.compute_thread import in_passing_thread_async
from draftwise.engine import Engine
from draftwise.errors import ConfigError
from draftwise.server.names import spellings
from draftwise.server.state import ServerState

logger = logging.getLogger("draftwise.server")

# How long a model stays loaded after its last request, by default (Ollama's default too).
DEFAULT_KEEP_ALIVE_S = 300.0
GIB = 2**30


class ModelUnavailable(Exception):
    """A model could not be loaded (its file, its memory): its requests fail, the others go on."""


@dataclass(frozen=True)
class ModelSource:
    """A model the server can load: the name clients send, how to load it (blocking: reads the
    file, calibrates), the memory it will hold (weights and KV caches, estimated before loading),
    and what /api/tags and /api/show tell of it (Ollama's `details`). aliases: the other names
    its stores give it (besides names.spellings of its name). check: raises when a load could not
    even start (its file gone since the server started); run before any model makes room for it."""

    name: str
    load: Callable[[], Engine]
    memory_bytes: int = 0
    size_bytes: int = 0
    details: Mapping[str, object] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    check: Callable[[], None] | None = None

    @property
    def memory_held(self) -> int:
        """memory_bytes as the budget counts it: never negative (an estimate from a hostile header
        must not let other models past the budget)."""
        return max(0, self.memory_bytes)


@dataclass
class _Entry:
    source: ModelSource
    state: ServerState | None = None
    loading: asyncio.Future | None = None
    reserved: bool = False  # its memory counts against the budget (loading or loaded)
    users: int = 0  # requests holding it
    last_used: float = 0.0  # monotonic
    expires_at: float | None = None  # monotonic; None: kept until evicted
    loaded_at: float = 0.0  # wall clock


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model as /api/ps shows it."""

    name: str
    memory_bytes: int
    size_bytes: int
    expires_at: float | None  # wall clock; None: kept until memory is needed
    loaded_at: float
    users: int


class ModelPool:
    """The server's models by name. make_state(name, engine) builds a loaded model's ServerState
    (its queue, metrics and worker); budget_bytes: what the loaded models may hold together
    (None: no limit); keep_alive_s: how long a model stays loaded after its last request when the
    request does not say (negative: for ever; 0: unloaded as soon as it is idle)."""

    def __init__(
        self,
        sources: Sequence[ModelSource],
        make_state: Callable[[str, Engine], ServerState],
        *,
        budget_bytes: int | None = None,
        keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not sources:
            raise ConfigError("a model pool needs at least one model")
        self._entries: dict[str, _Entry] = {}
        for source in sources:
            if source.name in self._entries:
                raise ConfigError(f"two models are named {source.name!r}; give each a name of its own")
            self._entries[source.name] = _Entry(source)
        self._names = _other_names(sources)
        self._make_state = make_state
        self.budget_bytes = budget_bytes
        self.keep_alive_s = keep_alive_s
        self._clock = clock
        self._changed = asyncio.Event()
        self._reaper: asyncio.Task | None = None
        self._closing: set[asyncio.Future] = set()  # unloaded models' closes, run in threads
        self.default = sources[0].name
        self.created = int(time.time())

    # ------------------------------------------------------------ names
    @property
    def sources(self) -> list[ModelSource]:
        return [e.source for e in self._entries.values()]

    def resolve(self, name: str | None) -> str | None:
        """The served name a request's `model` means (None or "": the default model; an unknown
        name: None, and the route answers its protocol's 404). Example: "m:latest" -> "m"."""
        if name is None or name == "":
            return self.default
        if name in self._entries:
            return name
        return self._names.get(name)

    def names_of(self, name: str) -> tuple[str, ...]:
        """Every other name the served model `name` answers to (an alias two models share is
        neither's). Example: "alpha.gguf" -> ("alpha.gguf:latest", "alpha", "alpha:latest")."""
        return tuple(alias for alias, served in self._names.items() if served == name)

    def is_loaded(self, name: str) -> bool:
        return self._entries[name].state is not None

    def state_of(self, name: str) -> ServerState | None:
        """A loaded model's state (None: not loaded)."""
        return self._entries[name].state

    def loaded(self) -> list[LoadedModel]:
        now, wall = self._clock(), time.time()
        out = []
        for e in self._entries.values():
            if e.state is None:
                continue
            expires = None if e.expires_at is None else wall + max(0.0, e.expires_at - now)
            out.append(
                LoadedModel(e.source.name, e.source.memory_held, e.source.size_bytes, expires, e.loaded_at, e.users)
            )
        return out

    # ------------------------------------------------------------ use
    @asynccontextmanager
    async def use(
        self, name: str, keep_alive_s: float | None = None, *, accepted: Callable[[], bool] = lambda: True
    ) -> AsyncIterator[ServerState]:
        """Hold model `name` (a served name, see resolve) for a request: load it first if needed
        (raises ModelUnavailable when that fails). On release its keep-alive restarts from the
        request's own (else the server's), if accepted() says the request was answered; a
        refused request leaves the keep-alive as it was."""
        entry = self._entries[name]
        entry.users += 1
        try:
            state = await self._loaded(entry)
            entry.last_used = self._clock()
            yield state
        finally:
            entry.users -= 1
            self._released(entry, (self.keep_alive_s if keep_alive_s is None else keep_alive_s) if accepted() else None)

    def _released(self, entry: _Entry, keep_alive_s: float | None) -> None:
        """keep_alive_s None: the request was refused, and the model's expiry stays as it was."""
        now = self._clock()
        entry.last_used = now
        if keep_alive_s is not None:
            entry.expires_at = _expiry(now, keep_alive_s)
        if entry.users == 0 and entry.state is not None and entry.expires_at is not None and entry.expires_at <= now:
            self._unload(entry, "keep_alive 0" if keep_alive_s == 0 else "keep_alive expired")
        self._wake()

    async def _loaded(self, entry: _Entry) -> ServerState:
        if entry.state is not None:
            return entry.state
        if entry.loading is None:
            entry.loading = asyncio.ensure_future(self._load(entry))
        # shielded: a request that leaves while the model loads does not cancel the others' load
        return await asyncio.shield(entry.loading)

    async def _load(self, entry: _Entry) -> ServerState:
        name = entry.source.name
        try:
            if entry.source.check is not None:  # before any other model is unloaded to make room
                await asyncio.to_thread(entry.source.check)
            await self._make_room(entry)
            started = time.monotonic()
            logger.info("loading model %s", name)
            # a thread that ends with the load, and its OpenMP team with it (compute_thread.py)
            engine = await in_passing_thread_async(entry.source.load)
            state = await asyncio.to_thread(self._make_state, name, engine)
            entry.state, entry.loaded_at = state, time.time()
            entry.expires_at = _expiry(self._clock(), self.keep_alive_s)  # until its requests say
            logger.info("model %s loaded in %.1f s", name, time.monotonic() - started)
            return state
        except ModelUnavailable:
            entry.reserved = False
            raise
        except Exception as exc:  # noqa: BLE001 - a model that cannot load fails its own requests only
            entry.reserved = False
            logger.error("model %s failed to load: %s", name, exc)
            raise ModelUnavailable(f"model {name!r} could not be loaded: {exc}") from exc
        finally:
            entry.loading = None
            self._wake()

    async def _make_room(self, entry: _Entry) -> None:
        """Reserve entry's memory, unloading idle models (least recently used first) and waiting
        for busy ones to finish while the budget is short."""
        need, budget = entry.source.memory_held, self.budget_bytes
        if budget is not None and need > budget:
            raise ModelUnavailable(
                f"model {entry.source.name!r} needs about {need / GIB:.1f} GiB, more than the server's memory "
                f"budget of {budget / GIB:.1f} GiB (serve --max-memory)"
            )
        while budget is not None:
            held = sum(e.source.memory_held for e in self._entries.values() if e.reserved and e is not entry)
            if held + need <= budget:
                break
            idle = [e for e in self._entries.values() if e.state is not None and e.users == 0 and e is not entry]
            if idle:
                self._unload(min(idle, key=lambda e: e.last_used), f"memory for {entry.source.name}")
                continue
            changed = self._changed
            await changed.wait()  # a busy model: wait until one finishes its requests
        entry.reserved = True

    def _unload(self, entry: _Entry, why: str) -> None:
        state, entry.state, entry.reserved, entry.expires_at = entry.state, None, False, None
        if state is None:
            return
        logger.info("unloading model %s (%s)", entry.source.name, why)
        closing = asyncio.get_running_loop().run_in_executor(None, _close, state)
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # ------------------------------------------------------------ keep-alive and shutdown
    def start(self) -> None:
        """Start unloading models whose keep-alive ran out (call on the server's event loop)."""
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        while True:
            now = self._clock()
            for e in self._entries.values():
                if e.state is not None and e.users == 0 and e.expires_at is not None and e.expires_at <= now:
                    self._unload(e, "keep_alive expired")
            deadlines = [e.expires_at for e in self._entries.values() if e.state is not None and e.expires_at]
            pause = min([1.0, *(d - now for d in deadlines)])
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), max(0.05, pause))
            except asyncio.TimeoutError:
                pass

    async def closed(self) -> None:
        """Wait until every model unloaded so far has been freed (its close runs in a thread)."""
        await asyncio.gather(*self._closing, return_exceptions=True)

    def close(self) -> None:
        """Stop the reaper and every loaded model's worker (the server is shutting down)."""
        if self._reaper is not None:
            self._reaper.cancel()
        for e in self._entries.values():
            if e.state is not None:
                _close(e.state)
                e.state = None


def _close(state: ServerState) -> None:
    state.serving.close()
    state.engine.close()


def _expiry(now: float, keep_alive_s: float) -> float | None:
    """When a model idle from `now` unloads (None: never; keep_alive_s negative is for ever)."""
    return None if keep_alive_s < 0 else now + keep_alive_s


def _other_names(sources: Sequence[ModelSource]) -> dict[str, str]:
    """Each other name a model answers to -> its served name. A served name is only its own
    model's; a name two models would answer to (two folders' "model.gguf" both "model") is
    neither's: a request must not reach one of them by chance."""
    served = {s.name for s in sources}
    claims: dict[str, set[str]] = {}
    for source in sources:
        for alias in (*source.aliases, *spellings(source.name), *(s for a in source.aliases for s in spellings(a))):
            if alias not in served:
                claims.setdefault(alias, set()).add(source.name)
    return {alias: next(iter(owners)) for alias, owners in claims.items() if len(owners) == 1}
