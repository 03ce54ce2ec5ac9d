"""Command line: draftwise pull | generate | demo | calibrate | bench | bench-serve | replay | serve | index.

A thin client of the public API. Bad arguments end with a one-line message and a
non-zero exit status, never a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys

import click
from dataclasses import replace
from pathlib import Path

from draftwise import models
from draftwise.types import SamplingParams, SpeculationConfig

EXIT_USAGE = 2


def _known_errors() -> tuple[type[BaseException], ...]:
    from draftwise.backends.base import BackendError
    from draftwise.engine import TokenizerMismatchError
    from draftwise.models import ModelError
    from draftwise.types import ConfigError

    return (ConfigError, ModelError, BackendError, TokenizerMismatchError, FileNotFoundError)


def friendly_errors(fn):
    """Turn the library's specific errors into `error: ...` and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _known_errors() as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


@contextlib.contextmanager
def download_progress():
    """A progress callback for models.pull (one bar per model), stopped on leaving the block."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    bars = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    transient=False, console=_stderr_console())
    tasks: dict[str, int] = {}

    def report(message: str, done: int, total: int) -> None:
        name = message.split(":")[0]
        if name not in tasks:
            bars.start()
            tasks[name] = bars.add_task(message, total=total)
        bars.update(tasks[name], completed=done, description=message)
        if done >= total:
            bars.refresh()

    try:
        yield report
    finally:
        bars.stop()


def _say_skipped(engine) -> None:
    for name, reason in engine.skipped_drafters.items():
        click.echo(f"note: drafter {name!r} {reason}", err=True)


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


@click.group()
@click.version_option(package_name="draftwise")
def main() -> None:
    """draftwise: lossless speculative decoding for local LLMs."""


@main.command()
@click.argument("names", nargs=-1)
@friendly_errors
def pull(names: tuple[str, ...]) -> None:
    """Fetch models (default: the target and draft pair) into the cache."""
    with download_progress() as report:
        for name in names or (models.DEFAULT_TARGET, models.DEFAULT_DRAFT):
            path = models.pull(name, report)
            click.echo(f"{name}: {path}", err=True)


def model_options(fn):
    """Options shared by generate, demo, bench and serve."""
    opts = [
        click.option("--target", default=models.DEFAULT_TARGET, show_default=True,
                     help="Target model: a registry name, a .gguf file or a transformers directory."),
        click.option("--backend", type=click.Choice(["auto", "llamacpp", "hf"]), default="auto", show_default=True),
        click.option("--n-ctx", type=int, default=4096, show_default=True, help="Context window in tokens."),
        click.option("--threads", type=int, default=None, help="CPU threads (default: all available)."),
        click.option("--dtype", default="float32", show_default=True, help="hf backend: float32|bfloat16|float16|float64."),
        click.option("--device", default="cpu", show_default=True, help="hf backend: cpu|cuda|auto."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def constraint_options(fn):
    """Structured output: at most one of --json-schema, --json-object, --regex, --grammar."""
    opts = [
        click.option("--json-schema", default=None,
                     help="Constrain the answer to a JSON schema: a file path or inline JSON."),
        click.option("--json-object", is_flag=True, help="Constrain the answer to any JSON object."),
        click.option("--regex", default=None, help="Constrain the answer to a regular expression."),
        click.option("--grammar", default=None, type=click.Path(dir_okay=False),
                     help="Constrain the answer to a grammar file (Lark, or llama.cpp GBNF)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _constraint(json_schema, json_object, regex, grammar):
    """The Constraint the options ask for, or None. Raises ConfigError on a bad combination or file."""
    from draftwise.constraints import Constraint
    from draftwise.types import ConfigError

    given = [name for name, value in (("--json-schema", json_schema), ("--json-object", json_object),
                                      ("--regex", regex), ("--grammar", grammar)) if value]
    if len(given) > 1:
        raise ConfigError(f"give one constraint, not {' and '.join(given)}")
    if json_schema is not None:
        text = json_schema
        if not json_schema.lstrip().startswith(("{", "true", "false")):
            path = Path(json_schema)
            if not path.is_file():
                raise ConfigError(f"--json-schema: {json_schema!r} is neither inline JSON nor a file")
            text = path.read_text()
        return Constraint.json_schema(text)
    if json_object:
        return Constraint.json_object()
    if regex is not None:
        return Constraint.regex(regex)
    if grammar is not None:
        return Constraint.grammar(Path(grammar).read_text())
    return None


def _load_options(backend, n_ctx, threads, dtype, device):
    from draftwise.loading import LoadOptions

    return LoadOptions(backend=backend, n_ctx=n_ctx, threads=threads, dtype=dtype, device=device)


@main.command()
@click.option("--prompt", required=True, help="The prompt text (with --chat: the user message).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--system", default=None, help="System message for --chat.")
@click.option("--draft", default="ngram", show_default=True,
              help="Drafters: a draft model (name or path), 'ngram', 'suffix', 'grammar', 'prediction', 'none', or several "
                   "comma-separated.")
@click.option("--policy", type=click.Choice(["auto", "fixed", "heuristic"]), default="auto", show_default=True)
@click.option("--k", "k", type=int, default=4, show_default=True, help="Draft tokens per step (fixed) or the starting k (heuristic); auto chooses k in 0..32 itself.")
@click.option("--max-tokens", type=int, default=256, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True)
@click.option("--min-p", type=float, default=0.0, show_default=True)
@click.option("--draft-temperature", type=float, default=None, help="Drafter's own temperature (default: the target's).")
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, token_ids and metrics.")
@click.option("--datastore", default=None, help="A retrieval datastore (draftwise index build) to draft from.")
@click.option("--branches", type=int, default=1, show_default=True,
              help="Token trees: verify up to N n-gram continuations per step (greedy, fixed policy).")
@click.option("--prediction", "prediction_file", default=None, type=click.Path(dir_okay=False, allow_dash=True),
              help="The expected output (a file, or - for stdin), e.g. the file being edited: drafted from.")
@constraint_options
@model_options
@friendly_errors
def generate(prompt, chat, system, draft, policy, k, max_tokens, temperature, top_p, top_k, min_p,
             draft_temperature, seed, stop, as_json, datastore, branches, prediction_file, json_schema, json_object,
             regex, grammar, target, backend, n_ctx, threads, dtype, device) -> None:
    """Generate text with speculative decoding, streaming it to the terminal."""
    from draftwise.loading import load_engine, parse_drafters

    prediction = None
    if prediction_file is not None:
        prediction = sys.stdin.read() if prediction_file == "-" else Path(prediction_file).read_text()
        names = parse_drafters(draft)
        if "prediction" not in names:  # a prediction needs its drafter
            draft = ",".join([*names, "prediction"])

    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                              max_tokens=max_tokens, stop=tuple(stop),
                              constraint=_constraint(json_schema, json_object, regex, grammar))
    speculation = SpeculationConfig(policy=policy, max_draft_tokens=k, draft_temperature=draft_temperature,
                                    max_branches=branches)
    options = replace(_load_options(backend, n_ctx, threads, dtype, device), n_seq_max=branches)
    with download_progress() as report:
        engine = load_engine(target, draft, options=options, speculation=speculation, progress=report,
                             datastore=datastore)
    _say_skipped(engine)
    messages = None
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    gen = engine.stream(None if chat else prompt, messages=messages, sampling=sampling, speculation=speculation,
                        prediction=prediction)
    for piece in gen:
        if not as_json:
            click.echo(piece, nl=False)
            sys.stdout.flush()
    result = gen.result
    if as_json:
        click.echo(json.dumps(result.to_dict()))
        return
    s = result.stats
    click.echo("")
    click.echo(
        f"[{s.num_generated} tokens, {s.tokens_per_second:.1f} tok/s decode, {s.tokens_per_second_e2e:.1f} tok/s "
        f"end-to-end, acceptance {s.acceptance_rate:.0%} ({s.num_accepted}/{s.num_drafted}), "
        f"{s.tokens_per_step:.2f} tokens/step, finish: {s.finish_reason}]",
        err=True,
    )


@main.command()
@click.option("--prompt", default="Rewrite this function with type hints and a docstring, changing nothing else:\n\n"
              "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
              "        if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n        else:\n"
              "            out.append(b[j])\n            j += 1\n    out.extend(a[i:])\n    out.extend(b[j:])\n"
              "    return out\n", show_default=False, help="User message (chat template applied).")
@click.option("--max-tokens", type=int, default=192, show_default=True)
@click.option("--draft-model", default=models.DEFAULT_DRAFT, show_default=True)
@model_options
@friendly_errors
def demo(prompt, max_tokens, draft_model, target, backend, n_ctx, threads, dtype, device) -> None:
    """Same prompt, greedy: plain decoding vs n-gram vs draft model vs auto; prints the speeds."""
    from rich.table import Table

    from draftwise.loading import load_engine

    options = _load_options(backend, n_ctx, threads, dtype, device)
    with download_progress() as report:
        # The demo shows the draft model at fixed k too, so it is loaded whether or not it can pay here.
        engine = load_engine(target, f"ngram,{draft_model}", options=options, progress=report,
                             speculation=SpeculationConfig(policy="fixed"))
    messages = [{"role": "user", "content": prompt}]
    sampling = SamplingParams(max_tokens=max_tokens)
    runs = [
        ("plain", (), SpeculationConfig(enabled=False)),
        ("ngram k=8", ("ngram",), SpeculationConfig(policy="fixed", max_draft_tokens=8)),
        ("draft k=4", ("draft",), SpeculationConfig(policy="fixed", max_draft_tokens=4)),
        ("auto", ("ngram", "draft"), SpeculationConfig(policy="auto")),
    ]
    console = _stderr_console()
    # Short headers and a legend: the table fits an 80-column terminal.
    table = Table(title=f"{target}, greedy, {max_tokens} tokens",
                  caption="speedup: tok/s over plain; acc.: draft tokens accepted; tok/step: tokens per target "
                          "forward; same: text identical to plain. ngram: prompt lookup, draft: the draft model, "
                          "both at fixed k; auto: the cost model picks drafter and k per step.")
    for col in ("method", "tok/s", "speedup", "acc.", "tok/step", "same"):
        table.add_column(col, justify="right", no_wrap=True)
    base_tps, base_ids = None, None
    engine.generate(messages=messages, sampling=SamplingParams(max_tokens=8))  # warm-up
    for label, drafter_list, spec in runs:
        console.print(f"[bold]{label}[/bold] ...")
        result = engine.generate(messages=messages, sampling=sampling, speculation=spec, drafters=drafter_list)
        s = result.stats
        if base_tps is None:
            base_tps, base_ids = s.tokens_per_second, result.token_ids
            click.echo(result.text)
        table.add_row(label, f"{s.tokens_per_second:.1f}", f"{s.tokens_per_second / base_tps:.2f}x",
                      f"{s.acceptance_rate:.0%}" if s.num_drafted else "-", f"{s.tokens_per_step:.2f}",
                      "yes" if result.token_ids == base_ids else "no")
    console.print(table)


@main.command()
@click.option("--draft", default="ngram,prediction", show_default=True,
              help="Drafters: a draft model (name or path), 'ngram', 'suffix', 'grammar', 'prediction', 'none', or several "
                   "comma-separated.")
@click.option("--policy", type=click.Choice(["auto", "fixed", "heuristic"]), default="auto", show_default=True)
@click.option("--k", "k", type=int, default=4, show_default=True, help="Draft tokens per step (fixed) or the starting k (heuristic); auto chooses k in 0..32 itself.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (loopback unless told otherwise).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--api-key", "api_keys", multiple=True,
              help="Require 'Authorization: Bearer KEY' on every route but /health; repeat for several tenants "
                   "(one tenant is never told how much of its prompt another's request left cached).")
@click.option("--log-requests", is_flag=True, help="Let error logs quote request content (debugging; off by default).")
@click.option("--model-name", default=None, help="Name clients use as `model` (default: the target's name).")
@click.option("--datastore", default=None, help="A retrieval datastore (draftwise index build) to draft from.")
@click.option("--parallel", type=click.IntRange(0, 64), default=0, show_default="4 on llama.cpp, 1 on transformers",
              help="Requests decoded together (continuous batching, a KV window of --n-ctx each); 0: the default.")
@click.option("--max-queue", type=click.IntRange(0, 100_000), default=64, show_default=True,
              help="Requests that may wait for a slot; more are refused with 503 and Retry-After.")
@click.option("--ray", "on_ray", is_flag=True,
              help="Serve as Ray Serve replicas, one engine each (needs draftwise[ray]); --threads then also "
                   "sets the CPUs each replica reserves (default 1).")
@click.option("--replicas", type=click.IntRange(1, 10_000), default=None, help="--ray: replicas to run (default 1).")
@click.option("--autoscale", default=None, metavar="MIN:MAX",
              help="--ray: let Ray scale between MIN and MAX replicas on ongoing requests per slot.")
@click.option("--address", default=None,
              help="--ray: the cluster to join: 'auto' (started by `ray start` on this machine), HOST:PORT or "
                   "ray://HOST:10001. Default: start a local cluster for this command.")
@model_options
@friendly_errors
def serve(draft, policy, k, host, port, api_keys, log_requests, model_name, datastore, parallel, max_queue, on_ray,
          replicas, autoscale, address, target, backend, n_ctx, threads, dtype, device) -> None:
    """Serve the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics)."""
    import logging

    speculation = SpeculationConfig(policy=policy, max_draft_tokens=k)
    if not on_ray and (replicas or autoscale or address):
        raise click.UsageError("--replicas, --autoscale and --address need --ray")
    if on_ray:
        threads = threads or 1  # a replica runs as many threads as the CPUs it reserves
    options = replace(_load_options(backend, n_ctx, threads, dtype, device), slots=parallel)
    if not api_keys and host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: serving on {host} without --api-key; anyone who can reach it can use it", err=True)
    if on_ray:
        _serve_on_ray(target, draft, options, speculation, model_name, api_keys, log_requests, max_queue, datastore,
                      replicas, autoscale, address, host, port)
        return

    import uvicorn

    from draftwise.loading import load_engine
    from draftwise.server import create_app

    with download_progress() as report:
        engine = load_engine(target, draft, options=options, speculation=speculation, progress=report,
                             datastore=datastore)
    _say_skipped(engine)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    app = create_app(engine, model_name or engine.target.name, api_keys=api_keys, log_content=log_requests,
                     max_queue=max_queue)
    if speculation.policy == "auto":  # calibrate before the first request, not inside it
        engine.target_time().curve
    # In-flight streams get 10 s after Ctrl+C; then they are cancelled at the engine's next step.
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=10)


def _serve_on_ray(target, draft, options, speculation, model_name, api_keys, log_requests, max_queue, datastore,
                  replicas, autoscale, address, host, port) -> None:
    """serve --ray: the same app as Ray Serve replicas; each replica loads (and pulls) its models itself."""
    from draftwise.server import ray_serve
    from draftwise.types import ConfigError

    if replicas and autoscale:
        raise click.UsageError("give --replicas or --autoscale, not both")
    bounds = None
    if autoscale:
        low, sep, high = autoscale.partition(":")
        if not sep or not low.isdigit() or not high.isdigit():
            raise ConfigError(f"--autoscale takes MIN:MAX (e.g. 1:4), got {autoscale!r}")
        bounds = (int(low), int(high))
    replica = ray_serve.ReplicaConfig(target=target, draft=draft, options=options, speculation=speculation,
                                      model_name=model_name, api_keys=tuple(api_keys), log_content=log_requests,
                                      max_queue=max_queue, datastore=datastore)
    scaling = ray_serve.Scaling(replicas=replicas or 1, autoscale=bounds)
    shape = f"{bounds[0]}..{bounds[1]} replicas" if bounds else f"{scaling.replicas} replica(s)"

    def ready(url: str) -> None:
        click.echo(f"serving on {url} with {shape} of {replica.num_slots} slot(s) each (Ctrl+C stops)", err=True)

    ray_serve.run(replica, scaling, address=address, host=host, port=port, ready=ready)


def _csv(kind, allow_same: bool = False):
    """A click callback: '0,0.7' -> (0.0, 0.7); 'same' -> None when allow_same."""

    def parse(ctx, param, value):
        if value is None:
            return None
        out = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            if allow_same and part.lower() in ("same", "none"):
                out.append(None)
                continue
            try:
                out.append(kind(part))
            except ValueError:
                raise click.BadParameter(f"{part!r} is not a valid {kind.__name__}") from None
        if not out:
            raise click.BadParameter("give at least one value")
        return tuple(out)

    return parse


@main.command()
@click.option("--suite", default=None, help="Shipped prompts: quick (2 per category), full, or one category's file. "
              "Default: quick.")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
              help="A Spec-Bench-style JSONL prompt file instead of a suite.")
@click.option("--categories", default=None, help="Only these categories, comma-separated.")
@click.option("--methods", default="baseline,auto,draft,ngram", show_default=True,
              help="Comma-separated: baseline, draft, ngram, heuristic, auto, D1+D2 (auto over both), POLICY:D.")
@click.option("--max-tokens", type=int, default=None, help="Per turn. Default: 128 for --suite quick, else 256.")
@click.option("--temperature", callback=_csv(float), default="0", show_default=True,
              help="Target temperature(s), comma-separated: one record set each (0 = greedy).")
@click.option("--draft-temperature", callback=_csv(float, allow_same=True), default="same", show_default=True,
              help="Draft model temperature(s), comma-separated; 'same' = the target's.")
@click.option("--k", "ks", callback=_csv(int), default="4", show_default=True,
              help="Draft length(s) k, comma-separated: one record set each.")
@click.option("--branches", callback=_csv(int), default="1", show_default=True,
              help="Token-tree widths for fixed-policy n-gram methods (greedy): 1 = a chain; e.g. 1,3.")
@click.option("--repeats", type=int, default=1, show_default=True, help="Run each prompt N times; keep the median.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True)
@click.option("--min-p", type=float, default=0.0, show_default=True)
@click.option("--ignore-eos", is_flag=True, help="Always generate --max-tokens tokens (for speed over long outputs).")
@click.option("--context-sweep", is_flag=True, help="Pad prompts to each --context-lengths size.")
@click.option("--context-lengths", callback=_csv(int), default="256,1024,4096", show_default=True)
@click.option("--draft-model", default=models.DEFAULT_DRAFT, show_default=True,
              help="Draft model for the draft/heuristic/auto methods ('none': n-gram only). Loaded only if needed.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench-out", show_default=True)
@click.option("--resume", is_flag=True, help="Continue the results.json in --out, skipping finished prompts.")
@click.option("--report-only", is_flag=True, help="Only rewrite report.md and the plots from --out/results.json.")
@click.option("--datastore", default=None, help="A retrieval datastore (draftwise index build): drafter 'datastore'.")
@model_options
@friendly_errors
def bench(suite, prompts_file, categories, methods, max_tokens, temperature, draft_temperature, ks, branches, repeats, seed,
          top_p, top_k, min_p, ignore_eos, context_sweep, context_lengths, draft_model, out_dir, resume, report_only,
          datastore, target, backend, n_ctx, threads, dtype, device) -> None:
    """Benchmark methods per task category; writes results.json, report.md and PNG plots to --out."""
    from pathlib import Path

    from draftwise.bench import prompts as bench_prompts
    from draftwise.bench import report as bench_report
    from draftwise.bench.methods import parse_methods
    from draftwise.bench.runner import BenchConfig, BenchRunner, RichProgress, load_bench_engine, load_results
    from draftwise.types import ConfigError

    out = Path(out_dir)
    if report_only:
        results = load_results(out / "results.json")
        click.echo(f"report: {bench_report.write_report(results, out)}", err=True)
        _print_bench_tables(results)
        return
    if suite and prompts_file:
        raise ConfigError("give --suite or --prompts, not both")
    if prompts_file:
        pool = bench_prompts.load_prompts(prompts_file)
        source = str(prompts_file)
    else:
        suite = suite or "quick"
        pool = bench_prompts.load_suite(suite)
        source = f"suite {suite}"
    chosen = bench_prompts.filter_categories(pool, [c.strip() for c in categories.split(",")] if categories else None)
    if max_tokens is None:
        max_tokens = 128 if suite == "quick" else 256
    draft_model = None if draft_model in (None, "", "none") else draft_model
    free = ["ngram", "suffix", "grammar", "prediction"] + (["datastore"] if datastore else [])
    specs = parse_methods(methods, free + (["draft"] if draft_model else []))
    need_draft = any("draft" in m.drafters for m in specs)
    auto_only = all(m.policy == "auto" for m in specs if "draft" in m.drafters)
    config = BenchConfig(methods=tuple(m.name for m in specs), max_tokens=max_tokens, temperatures=temperature,
                         ks=ks, branches=branches, draft_temperatures=draft_temperature, repeats=repeats,
                         context_lengths=context_lengths if context_sweep else (), seed=seed, top_k=top_k,
                         top_p=top_p, min_p=min_p, ignore_eos=ignore_eos)
    # Room for the longest prompt (padded or shipped) plus two turns of output.
    needed = (max(config.context_lengths) if config.context_lengths else 1536) + 2 * max_tokens + 256
    if needed > n_ctx:
        click.echo(f"note: raising --n-ctx from {n_ctx} to {needed} to fit the prompts and --max-tokens", err=True)
        n_ctx = needed
    if not any(not m.enabled for m in specs):
        click.echo("note: no baseline among the methods, so speedup and identical are not computed", err=True)
    options = replace(_load_options(backend, n_ctx, threads, dtype, device), n_seq_max=max(config.branches))
    with download_progress() as report:
        loaded = load_bench_engine(target, draft_model, need_draft=need_draft, options=options, progress=report,
                                   datastore=datastore, auto_only=auto_only)
    _say_skipped(loaded.engine)
    need_draft = need_draft and not loaded.engine.skipped_drafters
    meta = {"target": target, "draft_model": draft_model if need_draft else None, "prompts": source,
            "num_prompts": len(chosen), "backend": backend, "n_ctx": n_ctx, "threads": threads,
            "memory": loaded.memory}
    runner = BenchRunner(loaded.engine, chosen, config, out, resume=resume, progress=RichProgress(), meta=meta,
                         filler_pool=pool)
    try:
        results = runner.run()
    finally:
        # An interrupted run still gets a report of what it finished.
        path = bench_report.write_report(runner.results, out)
        click.echo(f"results: {runner.path}\nreport: {path}", err=True)
    _print_bench_tables(results)


def _print_bench_tables(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from draftwise.bench import report as bench_report

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # piped or captured: do not squeeze the table into 80 columns
    for setting, group in bench_report.by_setting(results.get("records", [])).items():
        table = Table(title=bench_report.setting_label(setting))
        for col in bench_report.TABLE_HEADERS:
            table.add_column(col, justify="left" if col in ("category", "method") else "right")
        for row in bench_report.category_rows(group):
            table.add_row(*row)
        console.print(table)


@main.command("bench-serve")
@click.argument("compare_dirs", nargs=-1, type=click.Path(exists=True), metavar="[RESULTS]...")
@click.option("--url", default=None, help="A running OpenAI-compatible server (draftwise serve, llama-server, ...). "
              "Default: start draftwise serve on a free loopback port for the run.")
@click.option("--serve-args", default="", help="Options for the draftwise serve started without --url, "
              "e.g. \"--draft ngram --k 8\".")
@click.option("--startup-timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="Seconds to wait for the started server's /health.")
@click.option("--api-key", default=None, help="Send 'Authorization: Bearer KEY' (a server started with --serve-args "
              "\"--api-key KEY\" needs it too). Never written to the results.")
@click.option("--model", default=None, help="The requests' model field. Default: the first one /v1/models lists.")
@click.option("--suite", default="quick", show_default=True,
              help="Shipped prompts (the first turn of each): quick, full, or one category's file.")
@click.option("--concurrency", "levels", callback=_csv(int), default="1,2,4,8", show_default=True,
              help="Concurrent clients per level, comma-separated.")
@click.option("--requests", "num_requests", type=click.IntRange(min=1), default=16, show_default=True,
              help="Requests per level, shared by its clients.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="Seconds a request may wait for the server's next bytes before it counts as an error.")
@click.option("--label", default=None, help="This run's name in reports and --compare (default: 'draftwise' for a "
              "started server, else the URL).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench-serve-out", show_default=True)
@click.option("--compare", is_flag=True, help="Only compare RESULTS (bench-serve --out directories or results.json "
              "files), the first as the reference; writes --out/compare.md.")
@friendly_errors
def bench_serve(compare_dirs, url, serve_args, startup_timeout, api_key, model, suite, levels, num_requests, max_tokens,
                timeout_s, label, out_dir, compare) -> None:
    """Load-test an OpenAI-compatible server: C streaming clients per level; tok/s, TTFT and latency percentiles.

    Writes results.json, report.md and throughput.png to --out. With --compare, reads earlier runs instead.
    """
    import shlex

    from draftwise.bench import load, load_report
    from draftwise.bench.prompts import load_suite

    out = Path(out_dir)
    if compare or compare_dirs:
        if not compare or len(compare_dirs) < 2:
            raise click.UsageError("give --compare and at least two RESULTS to compare")
        table = load_report.compare_markdown([load_report.load_run(p) for p in compare_dirs])
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(table)
        click.echo(table)
        click.echo(f"compare: {out / 'compare.md'}", err=True)
        return
    if any(c < 1 for c in levels):
        raise click.BadParameter(f"levels must be >= 1, got {','.join(map(str, levels))}", param_hint="--concurrency")
    if url and serve_args:
        raise click.UsageError("--serve-args is for the server bench-serve starts; it cannot change the one at --url")
    prompts = [p.turns[0] for p in load_suite(suite)]
    server = (contextlib.nullcontext() if url else
              load.ServeProcess(shlex.split(serve_args), startup_timeout_s=startup_timeout))
    meta = {"label": label or ("draftwise" if not url else url), "prompts": f"suite {suite}",
            "command": shlex.join(["draftwise", *load.redact_api_keys(sys.argv[1:])])}
    with server as started:
        if started is not None:
            # command: [python, -m, draftwise.cli, serve, ...]
            meta["serve_command"] = shlex.join(["draftwise", *load.redact_api_keys(started.command[3:])])
            click.echo(f"started {meta['serve_command']} at {started.url}", err=True)

        def say(s: dict) -> None:
            click.echo(f"C={s['concurrency']}: {s['num_requests']} requests, {s['num_errors']} errors, "
                       f"{s['tokens_per_second'] or 0:.1f} tok/s", err=True)

        results = load.run_bench(url or started.url, prompts, levels, num_requests=num_requests, max_tokens=max_tokens,
                                 model=model, api_key=api_key, timeout_s=timeout_s, meta=meta, progress=say)
    report = load_report.write_outputs(results, out)
    click.echo(f"results: {out / 'results.json'}\nreport: {report}", err=True)
    click.echo(load_report.level_table(results))


@main.command()
@click.option("--draft", default=models.DEFAULT_DRAFT, show_default=True, help="Draft model to calibrate too ('none' to skip).")
@click.option("--thorough", is_flag=True, help="Every n in 1..64 with 5 repeats instead of a quick sample.")
@click.option("--refresh", is_flag=True, help="Measure again even if a cached curve exists.")
@model_options
@friendly_errors
def calibrate(draft, thorough, refresh, target, backend, n_ctx, threads, dtype, device) -> None:
    """Measure (or show the cached) forward cost for n = 1..32 new tokens."""
    from rich.table import Table

    from draftwise.calibrate import cache_file, load_or_measure
    from draftwise.loading import load_backend

    options = _load_options(backend, n_ctx, threads, dtype, device)
    names = [target] + ([draft] if draft and draft != "none" else [])
    console = _stderr_console()
    for name in names:
        model = load_backend(name, options)
        console.print(f"calibrating {name} ...")
        curve = load_or_measure(model, thorough=thorough, refresh=refresh)
        table = Table(title=f"{name}: ms per forward over n new tokens ({cache_file(model)})")
        table.add_column("n", justify="right")
        table.add_column("ms", justify="right")
        table.add_column("ms / token", justify="right")
        for n, ms in curve.points:
            table.add_row(str(n), f"{ms:.1f}", f"{ms / n:.1f}")
        console.print(table)
        model.close()


@main.group()
def index() -> None:
    """Build retrieval datastores for the datastore drafter (--datastore)."""


@main.command()
@click.argument("results_path", metavar="RESULTS", type=click.Path(exists=True))
@click.option("--drafters", "sets", default="ngram,suffix,ngram+suffix", show_default=True,
              help="Drafter sets to replay, comma-separated; '+' joins drafters into one auto set.")
@click.option("--datastore", default=None, help="A datastore for sets that name 'datastore'.")
@click.option("--categories", default=None, help="Only these categories, comma-separated.")
@click.option("--free-lookups", is_flag=True, help="Count lookups as free (and never back off): deterministic.")
@click.option("--noise", type=float, default=0.0, show_default=True,
              help="Log-normal sigma of per-step timing noise, e.g. 0.15 for a shared machine.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the timing noise.")
@click.option("--max-k", type=click.IntRange(1, 256), default=None,
              help="Longest draft the policy plans (default: the auto policy's).")
@click.option("--curve", "curve_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A cost curve to replay with instead of the run's: another run's results.json "
                   "or a calibration file (under the cache directory's calibration/).")
@click.option("--oracle", is_flag=True, help="Also show each set's hindsight optimum and the share the policy takes.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@friendly_errors
def replay(results_path, sets, datastore, categories, free_lookups, noise, seed, max_k, curve_path, oracle,
           as_json) -> None:
    """Replay a bench run's baseline answers through the auto policy and free drafters (no model run).

    RESULTS is a bench --out directory or its results.json; its greedy baseline answers and
    calibrated cost curve are used. Prints tokens/step and speedup per category and set.
    """
    from draftwise.bench import prompts as bench_prompts
    from draftwise.bench import replay as bench_replay
    from draftwise.bench.runner import load_results
    from draftwise.loading import FREE_DRAFTERS, LoadOptions, datastore_drafter, free_drafter, load_backend
    from draftwise.policy_auto import MAX_K
    from draftwise.types import ConfigError

    path = Path(results_path)
    results = load_results(path / "results.json" if path.is_dir() else path)
    answers = bench_replay.baseline_answers(results)
    curve = bench_replay.calibrated_curve(json.loads(Path(curve_path).read_text()) if curve_path else results)
    meta = results.get("meta", {})
    source = str(meta.get("prompts", ""))
    pool = (bench_prompts.load_suite(source.removeprefix("suite ")) if source.startswith("suite ")
            else bench_prompts.load_prompts(source))
    chosen = bench_prompts.filter_categories(pool, [c.strip() for c in categories.split(",")] if categories else None)

    def make(name: str):
        if name == "datastore":
            if not datastore:
                raise ConfigError("a set names 'datastore' but no --datastore was given")
            return datastore_drafter(datastore)
        if name not in FREE_DRAFTERS:
            raise ConfigError(f"replay covers the free drafters ({', '.join(FREE_DRAFTERS)}, datastore), got {name!r}")
        return free_drafter(name)

    drafter_sets = {s.strip(): [make(n.strip()) for n in s.split("+")] for s in sets.split(",") if s.strip()}
    if not drafter_sets:
        raise ConfigError("--drafters names no drafter set")
    backend = load_backend(meta.get("target", models.DEFAULT_TARGET),
                           LoadOptions(backend=meta.get("backend", "auto"), n_ctx=256))
    try:
        runs = bench_replay.replay(chosen, answers, backend.tokenizer, drafter_sets, curve,
                                   count_lookups=not free_lookups, noise=noise, seed=seed,
                                   max_k=max_k or MAX_K, oracle=oracle)
    finally:
        backend.close()
    summary = bench_replay.summarize(runs)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"replay of {path}: tokens/step · speedup vs plain",
                  caption=f"cost curve, ms by tokens per forward: {dict(curve.points)}")
    table.add_column("category")
    for name in drafter_sets:
        table.add_column(name, justify="right")
    for category, by_set in summary.items():
        table.add_row(category, *(f"{by_set[n]['tokens_per_step']:.2f} · {by_set[n]['speedup']:.3f}x"
                                  + (f" · oracle {by_set[n]['oracle_speedup']:.3f}x" if oracle else "")
                                  for n in drafter_sets))
    Console(width=160).print(table)


def _build_index(texts, out, target, max_tokens) -> None:
    from draftwise.drafters.datastore import build_datastore
    from draftwise.loading import LoadOptions, load_backend

    console = _stderr_console()
    backend = load_backend(target, LoadOptions(n_ctx=256))  # NOTE: keep it alive: its tokenizer uses the model
    meta = build_datastore(texts, lambda text: backend.tokenizer.encode(text, add_special=False), Path(out),
                           max_tokens=max_tokens, progress=lambda m: console.print(m))
    backend.close()
    console.print(f"{out}: {meta['num_docs']} documents, {meta['num_tokens']:,} tokens, "
                  f"{meta['bytes'] / 2**20:.1f} MiB; tokenised in {meta['tokenize_s']} s, "
                  f"suffix array in {meta['suffix_array_s']} s")


@index.command("build")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--out", required=True, help="Output directory of the datastore.")
@click.option("--target", default=models.DEFAULT_TARGET, show_default=True, help="Model whose tokenizer to use.")
@click.option("--glob", "pattern", default="*", show_default=True, help="File name pattern inside directories.")
@click.option("--max-tokens", type=int, default=None, help="Stop after this many tokens.")
@friendly_errors
def index_build(paths, out, target, pattern, max_tokens) -> None:
    """Tokenise files (or directory trees) into an on-disk suffix array."""

    def texts():
        for raw in paths:
            root = Path(raw)
            files = sorted(p for p in root.rglob(pattern) if p.is_file()) if root.is_dir() else [root]
            for f in files:
                try:
                    yield str(f), f.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue

    _build_index(texts(), out, target, max_tokens)


@index.command("stdlib")
@click.option("--out", required=True, help="Output directory of the datastore.")
@click.option("--target", default=models.DEFAULT_TARGET, show_default=True)
@click.option("--max-tokens", type=int, default=None, help="Stop after this many tokens.")
@friendly_errors
def index_stdlib(out, target, max_tokens) -> None:
    """Recipe: a datastore from this Python's own standard library source (no download)."""
    from draftwise.drafters.datastore import stdlib_sources

    _build_index(stdlib_sources(), out, target, max_tokens)


def run() -> None:
    main()


if __name__ == "__main__":
    main()
