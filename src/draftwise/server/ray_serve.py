"""Replicas of `draftwise serve` on Ray Serve: `ray_app(replica, scaling) -> Application`, `run(...)`.

Each replica builds its own engine from plain settings (resolving, i.e. pulling, the models on
its own node) and serves `create_app` around it: the same routes, streaming, errors, API keys
and `usage.speculative` as the single server. Ray Serve routes, queues and autoscales; its
answers carry `x-draftwise-replica`. The only module that imports Ray (install `draftwise[ray]`).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftwise import models
from draftwise.compute_thread import in_passing_thread_async
from draftwise.loading import LoadOptions, backend_kind, default_slots
from draftwise.server.access import Access
from draftwise.server.serving import MAX_QUEUE
from draftwise.types import ConfigError, SpeculationConfig

APP_NAME = "draftwise"
REPLICA_HEADER = "x-draftwise-replica"
INSTALL_HINT = 'Ray Serve is not installed; install the extra: pip install "draftwise[ray]"'

logger = logging.getLogger("draftwise.server")


@dataclass(frozen=True)
class PoolConfig:
    """serve --models on Ray: every replica serves every model, each loaded when a request first
    names it there (catalog.py, pool.py)."""

    models: str  # all | NAME,... | DIR, resolved on each replica's node
    keep_alive_s: float
    budget_bytes: int | None = None


@dataclass(frozen=True)
class ReplicaConfig:
    """What one replica loads and serves: the arguments of `draftwise serve`, all picklable."""

    target: str = models.DEFAULT_TARGET
    draft: str | None = "ngram,prediction,grammar,calls"
    options: LoadOptions = LoadOptions(slots=0)
    speculation: SpeculationConfig = SpeculationConfig()
    model_name: str | None = None  # default: the target's name
    api_keys: tuple[str, ...] = ()
    metrics_key: str | None = None
    access: Access = Access()  # the Hosts and web origins answered (access.py)
    log_content: bool = False
    max_queue: int = MAX_QUEUE
    datastore: str | None = None
    pool: PoolConfig | None = None  # several models, loaded as asked for (target first)

    @property
    def num_slots(self) -> int:
        """Requests one replica decodes together; slots=0 resolves as load_backend does.

        NOTE: resolved here, before any replica exists, because it sets the deployment's
        max_ongoing_requests; the replica checks that its engine agrees.
        """
        if self.options.slots:
            return self.options.slots
        # A registry name is a GGUF file, whether pulled yet or not.
        path = Path("model.gguf") if self.target in models.REGISTRY else Path(self.target)
        return default_slots(backend_kind(path, self.options), self.options)


@dataclass(frozen=True)
class Scaling:
    """How many replicas and what each reserves.

    replicas: a fixed count; autoscale: (min, max) replicas instead, scaled by Ray on ongoing
    plus queued requests per replica against its slots. num_cpus: CPUs a replica reserves
    (default: its threads, or 1); num_gpus: default 1 on a cuda device, else 0.
    """

    replicas: int = 1
    autoscale: tuple[int, int] | None = None
    num_cpus: float | None = None
    num_gpus: float | None = None
    ray_actor_options: dict[str, Any] = field(default_factory=dict)  # merged over the reservations

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"replicas must be >= 1, got {self.replicas}")
        if self.autoscale is not None:
            low, high = self.autoscale
            if not 0 <= low <= high or high < 1:
                raise ConfigError(f"autoscale needs 0 <= MIN <= MAX and MAX >= 1, got {low}:{high}")
        for name, value in (("num_cpus", self.num_cpus), ("num_gpus", self.num_gpus)):
            if value is not None and value < 0:
                raise ConfigError(f"{name} must be >= 0, got {value}")


def deployment_options(replica: ReplicaConfig, scaling: Scaling) -> dict[str, Any]:
    """Ray Serve deployment options: one engine per replica, as many ongoing requests as it has slots.

    >>> deployment_options(ReplicaConfig(options=LoadOptions(slots=2, threads=2)), Scaling(replicas=3))
    {'max_ongoing_requests': 2, 'max_queued_requests': 64,
     'ray_actor_options': {'num_cpus': 2, 'num_gpus': 0}, 'num_replicas': 3}
    """
    slots = replica.num_slots
    if replica.max_queue < 1:
        raise ConfigError(
            f"max_queue (serve --max-queue) must be >= 1 on Ray: it bounds each Ray proxy's queue, "
            f"got {replica.max_queue}"
        )
    num_cpus = scaling.num_cpus if scaling.num_cpus is not None else replica.options.threads or 1
    num_gpus = scaling.num_gpus if scaling.num_gpus is not None else int(replica.options.device.startswith("cuda"))
    options: dict[str, Any] = {
        # NOTE: Ray's default of 5 would queue requests inside a 1-slot replica (where no other
        # replica can take them) or cap a 16-slot one at 5; with max_ongoing_requests = slots a
        # request waits in Ray's queue until some replica has a free slot.
        "max_ongoing_requests": slots,
        "max_queued_requests": replica.max_queue,
        "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus, **scaling.ray_actor_options},
    }
    if scaling.autoscale is None:
        options["num_replicas"] = scaling.replicas
    else:
        low, high = scaling.autoscale
        options["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": high,
            "initial_replicas": max(low, 1),
            "target_ongoing_requests": slots,
        }
    return options


def ray_app(replica: ReplicaConfig, scaling: Scaling = Scaling()):
    """The Ray Serve application (`serve.run(ray_app(...))`); raises ConfigError without Ray."""
    return _replica_class().options(**deployment_options(replica, scaling)).bind(replica)


def run(
    replica: ReplicaConfig,
    scaling: Scaling = Scaling(),
    *,
    address: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    ready=None,
) -> None:
    """Start (address None: a new local cluster) or join a cluster, deploy, serve until Ctrl+C.

    address: "auto" joins the cluster `ray start` runs on this machine; "HOST:PORT" or
    "ray://HOST:10001" a remote one. On Ctrl+C the application is deleted; a cluster this call
    started is shut down with it. ready(url) is called once every replica answers.
    """
    deployment_options(replica, scaling)  # settings are checked before Ray is imported or a cluster starts
    ray, serve = _import_ray()
    app = ray_app(replica, scaling)
    ray.init(address=address or "local")
    try:
        serve.start(http_options={"host": host, "port": port})
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
        except RuntimeError as exc:  # a replica's constructor failed (a model missing on its node, ...)
            raise ConfigError(f"the replicas did not start: {_failure(serve) or exc}") from None
        if ready is not None:
            ready(f"http://{host}:{port}")
        _wait_for_interrupt()
    finally:
        try:
            serve.delete(APP_NAME)
            if address is None:
                serve.shutdown()
        finally:
            ray.shutdown()


def _failure(serve) -> str:
    """The last line of the error that stopped the deployment, e.g. the ModelError of a replica."""
    try:
        deployments = serve.status().applications[APP_NAME].deployments.values()
    except Exception:  # noqa: BLE001 - only a nicer message is lost
        return ""
    lines = [line.strip() for d in deployments for line in d.message.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _wait_for_interrupt() -> None:
    """Until Ctrl+C or SIGTERM (which a service manager sends), so that run() cleans up either way."""
    import signal
    import threading

    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


def _import_ray():
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return ray, serve


@functools.cache
def _replica_class():
    """The deployment class; built on first use, so that importing this module needs no Ray."""
    _, serve = _import_ray()

    @serve.deployment(name="DraftwiseReplica")
    @serve.ingress()  # the app comes from __serve_build_asgi_app__, once the engine is loaded
    class DraftwiseReplica:
        async def __init__(self, config: ReplicaConfig) -> None:
            _log_to_stderr()
            # Off the replica's event loop: loading may first pull the models into this node's cache.
            self._config = config
            # several models: each loads when first asked for, not here
            self._engine = None if config.pool else await in_passing_thread_async(_load, config)
            self._replica_id = serve.get_replica_context().replica_id.unique_id

        def __serve_build_asgi_app__(self):
            from draftwise.server import create_app

            config, engine = self._config, self._engine
            if config.pool is not None:
                app = _pool_app(config)
                app.add_middleware(ReplicaHeader, replica=self._replica_id)
                return app
            app = create_app(
                engine,
                config.model_name or engine.target.name,
                api_keys=config.api_keys,
                metrics_key=config.metrics_key,
                log_content=config.log_content,
                access=config.access,
                max_queue=config.max_queue,
            )
            app.add_middleware(ReplicaHeader, replica=self._replica_id)
            return app

    return DraftwiseReplica


def _log_to_stderr() -> None:
    """The replica logs what `draftwise serve` logs (INFO and up); Ray forwards its stderr to the driver."""
    draftwise_logger = logging.getLogger("draftwise")
    if not draftwise_logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        draftwise_logger.addHandler(handler)
        draftwise_logger.setLevel(logging.INFO)


class _PullLog:
    """models.pull progress as one log line per tenth of each model (a replica has no terminal)."""

    def __init__(self) -> None:
        self.tenths: dict[str, int] = {}

    def __call__(self, message: str, done: int, total: int) -> None:
        name, tenth = message.split(":")[0], 10 * done // max(total, 1)
        if self.tenths.get(name) != tenth:
            self.tenths[name] = tenth
            logger.info("%s: %d%% of %.0f MB", message, 10 * tenth, total / 1e6)


def _pool_app(config: ReplicaConfig):
    """A replica's app of several models (serve --models --ray): the single server's pool app."""
    from dataclasses import replace

    from draftwise.server import catalog
    from draftwise.server.app import create_pool_app

    pool = config.pool
    served = catalog.chosen(pool.models, config.target, config.options.models_dirs)
    sources = catalog.sources(
        served,
        lambda name: _load(replace(config, target=name)),
        n_ctx=config.options.n_ctx,
        num_slots=config.num_slots,
    )
    return create_pool_app(
        sources,
        budget_bytes=pool.budget_bytes,
        keep_alive_s=pool.keep_alive_s,
        api_keys=config.api_keys,
        metrics_key=config.metrics_key,
        log_content=config.log_content,
        max_queue=config.max_queue,
        access=config.access,
    )


def _load(config: ReplicaConfig):
    from draftwise.loading import load_engine

    engine = load_engine(
        config.target,
        config.draft,
        options=config.options,
        speculation=config.speculation,
        progress=_PullLog(),
        datastore=config.datastore,
    )
    for name, reason in engine.skipped_drafters.items():
        logger.info("drafter %r %s", name, reason)
    if engine.num_slots != config.num_slots:
        raise ConfigError(
            f"the replica's engine has {engine.num_slots} slot(s) but the deployment was sized for "
            f"{config.num_slots}; give the slots explicitly (serve --parallel N)"
        )
    if config.speculation.policy == "auto":  # calibrate before the first request, not inside it
        _ = engine.target_time().curve
    return engine


class ReplicaHeader:
    """ASGI middleware: every HTTP answer names the replica that gave it (`x-draftwise-replica`)."""

    def __init__(self, app, *, replica: str) -> None:
        self.app, self.header = app, (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)
