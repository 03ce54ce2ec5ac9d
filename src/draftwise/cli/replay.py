"""draftwise replay: a bench run's baseline answers through the auto policy and free drafters,
priced by the run's calibrated cost curve (no model run), beside the run's own measured time."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from draftwise import models
from draftwise.backends.base import text_marks
from draftwise.cli.common import friendly_errors
from draftwise.errors import ConfigError
from draftwise.loading import FREE_DRAFTERS, LoadOptions, datastore_drafter, free_drafter, load_backend
from draftwise.policy.auto import MAX_K


@click.command()
@click.argument("results_path", metavar="[RESULTS]", required=False, type=click.Path(exists=True))
@click.option(
    "--prompts",
    "prompts_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Replay this prompt file's reference answers instead of a run's (e.g. a `draftwise corpus` split); "
    "needs --curve when no RESULTS is given.",
)
@click.option("--target", default=None, help="The model whose tokenizer encodes the prompts (default: the run's).")
@click.option(
    "--drafters",
    "sets",
    default="ngram,suffix,ngram+suffix",
    show_default=True,
    help="Drafter sets to replay, comma-separated; '+' joins drafters into one auto set.",
)
@click.option("--datastore", default=None, help="A datastore for sets that name 'datastore'.")
@click.option("--categories", default=None, help="Only these categories, comma-separated.")
@click.option("--free-lookups", is_flag=True, help="Count lookups as free (and never back off): deterministic.")
@click.option(
    "--noise",
    type=float,
    default=0.0,
    show_default=True,
    help="Log-normal sigma of per-step timing noise, e.g. 0.15 for a shared machine.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the timing noise.")
@click.option(
    "--max-k",
    type=click.IntRange(1, 256),
    default=None,
    help=f"Longest draft the policy plans (default: the auto policy's, {MAX_K}).",
)
@click.option(
    "--curve",
    "curve_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A cost curve to replay with instead of the run's: another run's results.json "
    "or a calibration file (under the cache directory's calibration/).",
)
@click.option(
    "--prices",
    type=click.Choice(["calibration", "run", "corrected"]),
    default="calibration",
    show_default=True,
    help="What forwards cost in the replay and its optimum: the cost curve's (calibration), or the curve scaled "
    "per size of forward by what RESULTS' own forwards took (run: the machine as it was during the run; the "
    "policy still starts from the curve and learns the difference, as live), or the curve corrected by the "
    "prices the host's live runs learnt, kept beside the calibration file --curve names (corrected: what a "
    "live policy starts from; it believes them too).",
)
@click.option("--oracle", is_flag=True, help="Also show each set's hindsight optimum and the share the policy takes.")
@click.option(
    "--gaps",
    "show_gaps",
    is_flag=True,
    help="Also show where the hindsight optimum gains on the policy: time by place in the copies "
    "(none, start, resume after an edit, early, deep) and drafter (implies --oracle).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@friendly_errors
def replay(
    results_path,
    prompts_path,
    target,
    sets,
    datastore,
    categories,
    free_lookups,
    noise,
    seed,
    max_k,
    curve_path,
    prices,
    oracle,
    show_gaps,
    as_json,
) -> None:
    """Replay a bench run's baseline answers, or a prompt file's reference answers, through the
    auto policy and free drafters (no model run).

    RESULTS is a bench --out directory or its results.json; its greedy baseline answers and
    calibrated cost curve are used. With --prompts FILE instead, each prompt's `reference` is the
    answer replayed (a proxy for the model's: what an edit, a quote or a filled middle should be)
    and --curve gives the cost curve. Prints tokens/step and speedup per category and set.
    """
    from draftwise.bench.offline import account as bench_account
    from draftwise.bench.offline import replay as bench_replay
    from draftwise.bench.suites import prompts as bench_prompts

    if prices == "run" and results_path is None:
        raise ConfigError("--prices run needs a bench run (RESULTS) whose forwards set the prices")
    results, pool, answers = _sources(results_path, prompts_path)
    if curve_path is None and results is None:
        raise ConfigError(
            "replaying a prompt file's references needs --curve (a calibration file or a run's results.json)"
        )
    curve = bench_replay.calibrated_curve(json.loads(Path(curve_path).read_text()) if curve_path else results)
    if prices == "corrected":
        curve = _corrected(curve, curve_path)
    priced = bench_account.run_prices(results, curve) if prices == "run" else None
    meta = (results or {}).get("meta", {})
    path = Path(results_path or prompts_path)
    chosen = bench_prompts.filter_categories(pool, [c.strip() for c in categories.split(",")] if categories else None)

    drafter_sets = _drafter_sets(sets, datastore)
    backend = load_backend(
        target or meta.get("target", models.DEFAULT_TARGET), LoadOptions(backend=meta.get("backend", "auto"), n_ctx=256)
    )
    marks = text_marks(backend.tokenizer, backend.vocab_size)
    try:
        runs = bench_replay.replay(
            chosen,
            answers,
            backend.tokenizer,
            drafter_sets,
            curve,
            count_lookups=not free_lookups,
            noise=noise,
            seed=seed,
            max_k=max_k or MAX_K,
            oracle=oracle,
            detail=show_gaps,
            line_ends=marks.line_ends,
            fences=marks.fences,
            prices=priced,
        )
    finally:
        backend.close()
    oracle = oracle or show_gaps
    summary = bench_replay.summarize(runs)
    gap_rows = _gap_rows(bench_replay.gaps(runs)) if show_gaps else None
    live = bench_account.splits(results, curve) if results else []  # records with a time account
    if as_json:
        click.echo(
            json.dumps(
                {
                    **summary,
                    **({"gaps": gap_rows} if gap_rows is not None else {}),
                    **({"run_price_factors": [list(f) for f in priced.factors]} if priced is not None else {}),
                    **({"live_vs_replay": [dataclasses.asdict(s) | {"kept": s.kept} for s, _ in live]} if live else {}),
                },
                indent=2,
            )
        )
        return
    _print_replay(path, curve, priced, prices, drafter_sets, summary, oracle, gap_rows, live)


def _drafter_sets(sets: str, datastore) -> dict[str, list]:
    """--drafters' sets by name ('ngram+suffix'), each its drafters (free ones, or the datastore)."""

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
    return drafter_sets


def _print_replay(path, curve, priced, prices, drafter_sets, summary, oracle, gap_rows, live) -> None:
    """The replay's tables: tokens/step and speedup per category and set (and the oracle's), the
    gaps where asked (gap_rows not None), and each live method's time account against the replay."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"replay of {path}: tokens/step · speedup vs plain",
        caption=f"cost curve, ms by tokens per forward at {curve.context_len} tokens of context: "
        f"{dict(curve.points)}; each 1,000 tokens more add {curve.growth_text()}"
        + (
            "; priced at this run's forwards, the curve times "
            + ", ".join(f"{f:.2f} at {n:g} rows" for n, f in priced.factors)
            if priced is not None
            else ""
        )
        + (f"; corrected by the host's runs, {_factors_text(curve)}" if prices == "corrected" else ""),
    )
    table.add_column("category")
    for name in drafter_sets:
        table.add_column(name, justify="right")
    for category, by_set in summary.items():
        table.add_row(
            category,
            *(
                f"{by_set[n]['tokens_per_step']:.2f} · {by_set[n]['speedup']:.3f}x"
                + (f" · oracle {by_set[n]['oracle_speedup']:.3f}x" if oracle else "")
                for n in drafter_sets
            ),
        )
    console = Console(width=160)
    console.print(table)
    if gap_rows is not None:
        console.print(_gap_table(gap_rows))
    for result, buckets in live:
        _print_account(console, result, buckets)


def _print_account(console, result, buckets) -> None:
    """One live method's decode time split against its replayed forwards, and by rows x context."""
    from rich.table import Table

    split = Table(
        title=f"{result.method}: measured decode time against the replayed forwards of the same "
        f"{result.num_steps} steps (kept {result.kept:.1%})"
    )
    for column in ("measured ms", "replayed ms", "cost-curve error", "noise", "step overhead", "other"):
        split.add_column(column, justify="right")
    split.add_row(
        *(
            f"{v:.0f}"
            for v in (
                result.decode_ms,
                result.replayed_ms,
                result.curve_error_ms,
                result.noise_ms,
                result.overhead_ms,
                result.other_ms,
            )
        )
    )
    console.print(split)
    by_bucket = Table(title="forward by rows x context: measured against the curve (ms per step)")
    for column in ("rows from", "context from", "steps", "measured", "curve", "median ratio"):
        by_bucket.add_column(column, justify="right")
    for rows, ctx, n, measured, modelled, ratio in buckets:
        by_bucket.add_row(str(rows), str(ctx), str(n), f"{measured:.1f}", f"{modelled:.1f}", f"{ratio:.2f}")
    console.print(by_bucket)


def _sources(results_path, prompts_path):
    """(results or None, the prompt pool, answers by (question id, turn))."""
    from draftwise.bench.offline import replay as bench_replay
    from draftwise.bench.suites import prompts as bench_prompts
    from draftwise.bench.sweep.runner import load_results

    if results_path is None and prompts_path is None:
        raise ConfigError("give a bench run (RESULTS) or a prompt file with reference answers (--prompts)")
    results = None
    if results_path is not None:
        path = Path(results_path)
        results = load_results(path / "results.json" if path.is_dir() else path)
    if prompts_path is not None:
        pool = bench_prompts.load_prompts(prompts_path)
        return results, pool, bench_replay.reference_answers(pool)
    source = str(results.get("meta", {}).get("prompts", ""))
    pool = (
        bench_prompts.load_suite(source.removeprefix("suite "))
        if source.startswith("suite ")
        else bench_prompts.load_prompts(source)
    )
    return results, pool, bench_replay.baseline_answers(results)


def _gap_rows(found) -> list[dict]:
    """gaps() as rows, largest gap first, each with its share of the whole gap."""
    total = sum(g.gap_ms for g in found.values()) or 1.0
    rows = []
    for (place, drafter), g in sorted(found.items(), key=lambda kv: -kv[1].gap_ms):
        rows.append(
            {
                "place": place,
                "drafter": drafter,
                "tokens": g.tokens,
                "policy_ms": round(g.policy_ms, 1),
                "oracle_ms": round(g.oracle_ms, 1),
                "gap_share": round(g.gap_ms / total, 4),
                "policy_steps": g.policy_steps,
                "policy_plain_steps": g.policy_plain,
                "policy_mean_drafted": round(g.policy_drafted / g.policy_steps, 2) if g.policy_steps else 0.0,
                "policy_mean_accepted": round(g.policy_accepted / g.policy_steps, 2) if g.policy_steps else 0.0,
                "oracle_steps": g.oracle_steps,
                "oracle_mean_drafted": round(g.oracle_drafted / g.oracle_steps, 2) if g.oracle_steps else 0.0,
            }
        )
    return rows


def _gap_table(rows):
    from rich.table import Table

    table = Table(
        title="where the hindsight optimum gains: modelled ms by place in the copies and the drafter that could copy",
        caption="place: none (no drafter right), start (a copy begins), resume (one begins within 8 tokens of a "
        "16+-token copy's end: after an edit), early (its first 16 tokens), deep; steps: those starting there",
    )
    columns = ("place", "drafter", "tokens", "policy ms", "oracle ms", "share of gap", "policy steps (plain)")
    for column in (*columns, "drafted/accepted", "oracle steps", "oracle drafted"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            r["place"],
            r["drafter"],
            str(r["tokens"]),
            f"{r['policy_ms']:.0f}",
            f"{r['oracle_ms']:.0f}",
            f"{r['gap_share']:.1%}",
            f"{r['policy_steps']} ({r['policy_plain_steps']})",
            f"{r['policy_mean_drafted']:.1f}/{r['policy_mean_accepted']:.1f}",
            str(r["oracle_steps"]),
            f"{r['oracle_mean_drafted']:.1f}",
        )
    return table


def _corrected(curve, curve_path):
    """The calibration file's curve corrected by the prices kept beside it (policy.prices)."""
    from draftwise.policy.prices import CorrectedCurve, PriceBook, prices_file

    book_path = prices_file(Path(curve_path)) if curve_path else None
    if book_path is None or not book_path.is_file():
        raise ConfigError(
            "--prices corrected needs --curve naming a calibration file with the prices its host's runs "
            f"learnt beside it ({book_path or '<curve>.prices.json'})"
        )
    book = PriceBook.load(book_path, curve)
    if not book.priors:
        raise ConfigError(f"{book_path} corrects another curve (or an older version): the host calibrated again")
    return CorrectedCurve.of(curve, book)


def _factors_text(curve) -> str:
    """'1.12 at 33-64 rows up to 1,024 tokens, ...' for a corrected curve's caption."""

    def rows(r: int) -> str:
        return f"{r}" if r <= 2 else f"{r // 2 + 1}-{r}"

    return ", ".join(f"{f:.2f} at {rows(r)} rows up to {c:,} tokens" for (r, c), f in sorted(curve.book.priors.items()))
