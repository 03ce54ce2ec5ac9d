"""draftwise serve: the OpenAI API over one engine (uvicorn), or as Ray Serve replicas (--ray)."""

from __future__ import annotations

from dataclasses import replace

import click

from draftwise.cli.common import (
    DATASTORE_HELP,
    DRAFT_HELP,
    calibration_progress,
    download_progress,
    friendly_errors,
    load_options,
    model_options,
    policy_options,
    say_skipped,
)
from draftwise.errors import ConfigError, ModelError
from draftwise.loading import DEFAULT_SLOTS, load, load_engine
from draftwise.server.access import Access
from draftwise.server.serving import MAX_QUEUE
from draftwise.types import SpeculationConfig

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Seconds in-flight streams get after Ctrl+C; then they are cancelled at the engine's next step.
GRACEFUL_SHUTDOWN_S = 10


@click.command()
@click.option("--draft", default="ngram,prediction,grammar,calls", show_default=True, help=DRAFT_HELP)
@policy_options
@click.option(
    "--host", default=LOOPBACK[0], show_default=True, help="Interface to bind (loopback unless told otherwise)."
)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    help="Require 'Authorization: Bearer KEY' on every route but /health and the chat page; repeat for several tenants "
    "(one tenant is never told how much of its prompt another's request left cached).",
)
@click.option(
    "--metrics-key",
    default=None,
    help="The operator's bearer key for /metrics; with several --api-key tenants /metrics answers only "
    "this key (it counts every tenant's requests).",
)
@click.option(
    "--allowed-origins",
    "allowed_origins",
    multiple=True,
    metavar="ORIGIN[,ORIGIN]",
    help="Web origins whose pages may call the API from a browser, besides the chat page's own: "
    "https://app.example, chrome-extension://ID, http://localhost:* ('*' for any; repeatable). "
    "Other pages get 403.",
)
@click.option(
    "--allowed-hosts",
    "allowed_hosts",
    multiple=True,
    metavar="NAME[,NAME]",
    help="Host names to answer besides localhost, IP addresses and this machine's name (*.DOMAIN "
    "for a domain, '*' for any; repeatable). Bound to loopback, other Hosts get 403 (DNS rebinding); "
    "bound elsewhere, the Host is checked only when this is given.",
)
@click.option(
    "--models",
    "served_models",
    default=None,
    metavar="all|NAME,...|DIR",
    help="Serve several models, --target first (the default for a request that names none): 'all' the "
    "stores hold (draftwise models lists them), names, or a folder of GGUF files. Each loads when a "
    "request first names it.",
)
@click.option(
    "--keep-alive",
    default="5m",
    show_default=True,
    help="--models: how long a model stays loaded after its last request (Ollama's durations: 30s, 5m, "
    "1h; 0 unloads at once, -1 keeps it); a request's own keep_alive wins.",
)
@click.option(
    "--max-memory",
    type=click.FloatRange(min=0.1),
    default=None,
    metavar="GIB",
    help="--models: the memory the loaded models may hold together, in GiB (default: what is available at "
    "start); the least recently used idle model is unloaded to fit the next.",
)
@click.option("--log-requests", is_flag=True, help="Let error logs quote request content (debugging; off by default).")
@click.option("--model-name", default=None, help="Name clients use as `model` (default: the target's name).")
@click.option("--datastore", default=None, help=DATASTORE_HELP)
@click.option(
    "--parallel",
    type=click.IntRange(0, 64),
    default=0,
    show_default=f"{DEFAULT_SLOTS} on llama.cpp, 1 on transformers",
    help="Requests decoded together (continuous batching, a KV window of --n-ctx each); 0: the default.",
)
@click.option(
    "--max-queue",
    type=click.IntRange(0, 100_000),
    default=MAX_QUEUE,
    show_default=True,
    help="Requests that may wait for a slot; more are refused with 503 and Retry-After.",
)
@click.option(
    "--ray",
    "on_ray",
    is_flag=True,
    help="Serve as Ray Serve replicas, one engine each (needs draftwise[ray]); --threads then also "
    "sets the CPUs each replica reserves (default 1).",
)
@click.option("--replicas", type=click.IntRange(1, 10_000), default=None, help="--ray: replicas to run (default 1).")
@click.option(
    "--autoscale",
    default=None,
    metavar="MIN:MAX",
    help="--ray: let Ray scale between MIN and MAX replicas on ongoing requests per slot.",
)
@click.option(
    "--address",
    default=None,
    help="--ray: the cluster to join: 'auto' (started by `ray start` on this machine), HOST:PORT or "
    "ray://HOST:10001. Default: start a local cluster for this command.",
)
@model_options
@friendly_errors
def serve(
    draft,
    policy,
    k,
    host,
    port,
    api_keys,
    metrics_key,
    allowed_origins,
    allowed_hosts,
    served_models,
    keep_alive,
    max_memory,
    log_requests,
    model_name,
    datastore,
    parallel,
    max_queue,
    on_ray,
    replicas,
    autoscale,
    address,
    target,
    backend,
    n_ctx,
    threads,
    dtype,
    device,
) -> None:
    """Serve the OpenAI API (/v1/chat/completions, /v1/completions, /v1/responses: see docs/responses.md,
    /v1/models, /health, /metrics) and Ollama's (/api/chat, /api/generate, /api/tags, /api/show: see
    docs/ollama.md)."""

    speculation = SpeculationConfig(policy=policy, max_draft_tokens=k)
    if not on_ray and (replicas or autoscale or address):
        raise click.UsageError("--replicas, --autoscale and --address need --ray")
    if served_models is not None and model_name is not None:
        raise click.UsageError("--model-name names the one model of a server; with --models each keeps its own")
    if on_ray:
        threads = threads or 1  # a replica runs as many threads as the CPUs it reserves
    options = replace(load_options(backend, n_ctx, threads, dtype, device), slots=parallel)
    access = Access(bind_host=host, allowed_hosts=_listed(allowed_hosts), allowed_origins=_listed(allowed_origins))
    if not api_keys and host not in LOOPBACK:
        click.echo(f"warning: serving on {host} without --api-key; anyone who can reach it can use it", err=True)
    if on_ray:
        _serve_on_ray(
            target,
            draft,
            options,
            speculation,
            model_name,
            api_keys,
            metrics_key,
            access,
            _pool_config(served_models, keep_alive, max_memory),
            log_requests,
            max_queue,
            datastore,
            replicas,
            autoscale,
            address,
            host,
            port,
        )
        return

    import uvicorn

    from draftwise.server.errors import uvicorn_options

    guards = dict(api_keys=api_keys, metrics_key=metrics_key, log_content=log_requests, access=access)
    if served_models is not None:
        app = _pool_app(
            served_models, target, draft, options, speculation, datastore, keep_alive, max_memory, max_queue, guards
        )
    else:
        app = _one_model_app(target, draft, options, speculation, datastore, model_name, max_queue, guards)
    # uvicorn_options: its HTTP protocol with a deadline for request headers, and JSON 400s.
    uvicorn.run(
        app, host=host, port=port, log_level="info", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, **uvicorn_options()
    )


def _one_model_app(target, draft, options, speculation, datastore, model_name, max_queue, guards):
    """The app of one model, loaded (and calibrated, first run only) before any request."""
    import logging

    from draftwise.compute_thread import in_passing_thread
    from draftwise.server import create_app

    def load_and_price(report, calibrating):
        loaded = load(
            target,
            draft,
            options=options,
            speculation=speculation,
            progress=report,
            datastore=datastore,
            calibration_progress=calibrating,
        )
        if speculation.policy == "auto":  # the engine's cost model reads its curve now, not in a request
            _ = loaded.engine.target_time().curve
        return loaded

    with download_progress() as report, calibration_progress() as calibrating:
        # On a thread that ends here, with its OpenMP team: decoding runs on the serving worker's
        # team alone (compute_thread.py: two teams on a 2-core host made every forward slower).
        loaded = in_passing_thread(load_and_price, report, calibrating)
    engine = loaded.engine
    say_skipped(engine, loaded.draft_note)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    served_name = model_name or engine.target.name
    names = _store_names(target, served_name, options.models_dirs)
    return create_app(engine, served_name, max_queue=max_queue, names=names, **guards)


def _store_names(target: str, served_name: str, models_dirs) -> tuple[str, ...]:
    """The other stores' names for the target's file, which the one model answers to as well (an
    Ollama blob that is also in draftwise's cache: `smollm2:135m`)."""
    from draftwise import stores
    from draftwise.server import catalog

    try:
        resolved = stores.resolve(target, models_dirs, fetch=False)
        return catalog.other_names(served_name, resolved.path, models_dirs)
    except (ModelError, OSError):
        return ()  # a spec no store names (a Hugging Face repo): its spellings only


def _serve_on_ray(
    target,
    draft,
    options,
    speculation,
    model_name,
    api_keys,
    metrics_key,
    access,
    pool,
    log_requests,
    max_queue,
    datastore,
    replicas,
    autoscale,
    address,
    host,
    port,
) -> None:
    """serve --ray: the same app as Ray Serve replicas; each replica loads (and pulls) its models
    itself (with --models, every replica serves every model, each loaded when first asked for)."""
    from draftwise.server import ray_serve

    if replicas and autoscale:
        raise click.UsageError("give --replicas or --autoscale, not both")
    bounds = None
    if autoscale:
        low, sep, high = autoscale.partition(":")
        if not sep or not low.isdigit() or not high.isdigit():
            raise ConfigError(f"--autoscale takes MIN:MAX (e.g. 1:4), got {autoscale!r}")
        bounds = (int(low), int(high))
    replica = ray_serve.ReplicaConfig(
        target=target,
        draft=draft,
        options=options,
        speculation=speculation,
        model_name=model_name,
        api_keys=tuple(api_keys),
        metrics_key=metrics_key,
        access=access,
        log_content=log_requests,
        max_queue=max_queue,
        datastore=datastore,
        pool=pool,
    )
    scaling = ray_serve.Scaling(replicas=replicas or 1, autoscale=bounds)
    shape = f"{bounds[0]}..{bounds[1]} replicas" if bounds else f"{scaling.replicas} replica(s)"

    def ready(url: str) -> None:
        click.echo(f"serving on {url} with {shape} of {replica.num_slots} slot(s) each (Ctrl+C stops)", err=True)

    ray_serve.run(replica, scaling, address=address, host=host, port=port, ready=ready)


def _listed(values: tuple[str, ...]) -> tuple[str, ...]:
    """Repeated options that may each hold a comma-separated list: ("a,b", "c") -> ("a", "b", "c")."""
    return tuple(item.strip() for value in values for item in value.split(",") if item.strip())


def _pool_app(spec, target, draft, options, speculation, datastore, keep_alive, max_memory, max_queue, guards):
    """serve --models: the app of several models, each loaded (and calibrated, first run only)
    when a request first names it; says which it serves."""
    import logging

    from draftwise.model_facts import available_memory
    from draftwise.server import catalog
    from draftwise.server.app import create_pool_app
    from draftwise.server.pool import GIB

    keep_alive_s = _keep_alive(keep_alive)
    served = catalog.chosen(spec, target, options.models_dirs)

    def load(name: str):
        engine = load_engine(name, draft, options=options, speculation=speculation, datastore=datastore)
        if speculation.policy == "auto":  # the cost model reads its curve now, not in a request
            _ = engine.target_time().curve
        return engine

    slots = options.slots or DEFAULT_SLOTS
    sources = catalog.sources(served, load, n_ctx=options.n_ctx, num_slots=slots)
    budget = int(max_memory * GIB) if max_memory else available_memory()
    names = ", ".join(s.name for s in sources)
    room = f"{budget / GIB:.1f} GiB" if budget else "no memory limit"
    click.echo(f"serving {len(sources)} model(s), loaded as asked for, within {room}: {names}", err=True)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    return create_pool_app(sources, budget_bytes=budget, keep_alive_s=keep_alive_s, max_queue=max_queue, **guards)


def _keep_alive(value: str) -> float:
    """--keep-alive in seconds, read as Ollama reads keep_alive (server/keep_alive.py)."""
    from draftwise.server.keep_alive import keep_alive_seconds

    seconds = keep_alive_seconds(value)
    if seconds is None:
        raise ConfigError(
            f"--keep-alive takes a duration such as 30s, 5m, 1h, 0 or -1 (negative: for ever), got {value[:100]!r}"
        )
    return seconds


def _pool_config(spec, keep_alive, max_memory):
    """serve --models --ray: what each replica serves (None without --models)."""
    from draftwise.server.pool import GIB
    from draftwise.server.ray_serve import PoolConfig

    if spec is None:
        return None
    return PoolConfig(spec, _keep_alive(keep_alive), int(max_memory * GIB) if max_memory else None)
