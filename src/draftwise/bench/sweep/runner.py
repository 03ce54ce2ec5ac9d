"""The bench runner: prompts x methods x sweep settings through the public Engine API.

Per prompt (and padded context length): one short warm-up per drafter, so every
measured run starts with the prompt cached; then, per temperature, all method variants
run back to back on that prompt, `repeats` times, keeping the median run. results.json
is rewritten after every prompt, so an interrupted run keeps what it finished. The first
prompt of each category (first turn, first temperature and context) keeps its answers' token
sources, every method's, for the HTML report.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftwise.bench.record.progress import ProgressSink, RichProgress
from draftwise.bench.record.results import (
    FORMAT,
    check_same_run,
    compact_spans,
    load_results,
    norm,
    now,
    save_results,
    unit_key,
)
from draftwise.bench.record.timing import (
    CompetingLoad,
    WindowClock,
    acceptance_windows,
    current_rss_mb,
    host_info,
    peak_rss_mb,
)
from draftwise.bench.suites import tool_calls
from draftwise.bench.suites.fim import fim_ids, quality
from draftwise.bench.suites.prompts import Prompt, filler_for, pad_prompt
from draftwise.bench.sweep.compare import compare_with_baseline, divergence
from draftwise.bench.sweep.config import BenchConfig, Variant
from draftwise.bench.sweep.engine_setup import LoadedBench, load_bench_engine
from draftwise.bench.sweep.methods import parse_methods
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig

if TYPE_CHECKING:
    from draftwise.engine import Engine

WARMUP_TOKENS = 4

# What the CLI, scripts and tests read from the runner (some defined in its parts).
__all__ = [
    "FORMAT",
    "BenchConfig",
    "BenchRunner",
    "LoadedBench",
    "ProgressSink",
    "RichProgress",
    "divergence",
    "load_bench_engine",
    "load_results",
    "run_bench",
    "save_results",
]


# ---------------------------------------------------------------------------- the runner
class BenchRunner:
    """Runs a BenchConfig on an engine; `run()` returns the results dict (also on disk)."""

    def __init__(
        self,
        engine: Engine,
        prompts: Sequence[Prompt],
        config: BenchConfig,
        out_dir: str | Path,
        *,
        resume: bool = False,
        progress: ProgressSink | None = None,
        meta: dict | None = None,
        filler_pool: Sequence[Prompt] | None = None,
    ) -> None:
        self.engine = engine
        self.prompts = list(prompts)
        self.config = config
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / "results.json"
        self.progress = progress
        self.filler_pool = list(filler_pool) if filler_pool is not None else self.prompts
        self.drafter_objects = {d.name: d for d in engine.drafters}
        self.methods = parse_methods(config.methods, list(self.drafter_objects))
        self.variants = self._variants()
        # The prompts whose answers keep their token sources: the first of each category.
        self.traced = {p.category: p.question_id for p in reversed(self.prompts)}
        meta = dict(meta or {})
        meta.setdefault("drafters", list(self.drafter_objects))
        meta.setdefault("host", host_info())
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if resume and self.path.exists():
            self.results = load_results(self.path)
            check_same_run(self.results, config.to_dict(), meta, self.path)
            self.results["complete"] = False
        elif self.path.exists() and not resume:
            raise ConfigError(f"{self.path} already exists; pass --resume to continue it or choose another --out")
        else:
            meta["started_at"] = now()
            self.results = {
                "format": FORMAT,
                "config": norm(config.to_dict()),
                "meta": norm(meta),
                "complete": False,
                "records": [],
            }
        self.memory = self.results["meta"].setdefault("memory", {})
        self._weights()

    def _variants(self) -> list[Variant]:
        out = []
        for m in self.methods:
            if not m.enabled:
                out.append(Variant(m))
                continue
            samples = any(not self.drafter_objects[d].free for d in m.drafters)
            # Token trees: only the fixed policy with the drafter that proposes them (n-gram lookup).
            trees = m.policy == "fixed" and all(isinstance(self.drafter_objects[d], NgramDrafter) for d in m.drafters)
            for k in self.config.ks:
                for dt in self.config.draft_temperatures if samples else (None,):
                    for b in self.config.branches if trees else (1,):
                        out.append(Variant(m, k, dt, b))
        return out

    def _weights(self) -> None:
        """The models' weights as their libraries hold them (weight_bytes), into meta.memory beside
        the load's resident-memory probes: target_weights_mb and NAME_weights_mb per model drafter."""
        self.memory.setdefault("target_weights_mb", _mb(self.engine.target.weight_bytes()))
        for name, drafter in self.drafter_objects.items():
            if drafter.backend is not None:
                self.memory.setdefault(f"{name}_weights_mb", _mb(drafter.backend.weight_bytes()))

    def _memory(self, variant: Variant) -> dict:
        """What a run leaves held, in bytes: kv_target_bytes (the target's KV cache, allocated and
        used), kv_draft_bytes (the draft model's, where the method has one) and drafter_bytes (each
        of its other drafters' state, memory_bytes(): n-gram and suffix indexes, the datastore)."""
        out: dict = {}
        kv = self.engine.target.kv_bytes()
        out["kv_target_bytes"] = {"allocated": kv["allocated"], "used": kv["used"]}
        drafters = [self.drafter_objects[d] for d in variant.method.drafters]
        caches = [d.backend.kv_bytes() for d in drafters if d.backend is not None]
        if caches:
            out["kv_draft_bytes"] = {key: sum(kv[key] for kv in caches) for key in ("allocated", "used")}
        out["drafter_bytes"] = {d.name: d.memory_bytes() for d in drafters if d.backend is None}
        return out

    def _uses_model(self, variant: Variant) -> bool:
        return any(isinstance(self.drafter_objects[d], ModelDrafter) for d in variant.method.drafters)

    # ------------------------------------------------------------------ loop
    def run(self) -> dict:
        cfg = self.config
        contexts: tuple[int | None, ...] = cfg.context_lengths or (None,)
        done = {unit_key(r["question_id"], r.get("context_tokens"), r["temperature"]) for r in self.results["records"]}

        def per_unit(p: Prompt) -> int:  # measured generations for one prompt at one setting
            return len(p.turns) * len(self.variants) * cfg.repeats

        total = sum(per_unit(p) for p in self.prompts) * len(contexts) * len(cfg.temperatures)
        if self.progress:
            self.progress.start(total)
        try:
            if len(done) < len(self.prompts) * len(contexts) * len(cfg.temperatures):
                self._global_warmup()
            for prompt in self.prompts:
                for ctx in contexts:
                    todo = [t for t in cfg.temperatures if unit_key(prompt.question_id, ctx, t) not in done]
                    if self.progress and len(todo) < len(cfg.temperatures):
                        self.progress.advance(per_unit(prompt) * (len(cfg.temperatures) - len(todo)))
                    if not todo:
                        continue
                    padded = self._pad(prompt, ctx)
                    # NOTE: history drafters (suffix) would otherwise learn this prompt's answer from
                    # the warm-up and from the methods before them; each method starts from here.
                    history = self._history_snapshot()
                    cold = self._warmup(padded)
                    for temperature in todo:
                        records = self._run_unit(padded, prompt, ctx, temperature, cold, history)
                        self.results["records"].extend(norm(records))
                        save_results(self.path, self.results)
            self.results["complete"] = True
            self.results["meta"]["finished_at"] = now()
            save_results(self.path, self.results)
        finally:
            if self.progress:
                self.progress.close()
        return self.results

    def _global_warmup(self) -> None:
        """Every method once on a short text: each method's policy is made and its first use paid
        here, untimed (the auto policy's curves were calibrated at load, loading.load)."""
        sampling = SamplingParams(max_tokens=WARMUP_TOKENS, ignore_eos=True)
        for variant in {v.method.name: v for v in self.variants}.values():
            if self.progress:
                self.progress.update(f"warm-up {variant.method.name}")
            try:
                self.engine.generate(
                    "Count: one, two, three, four, five, six",
                    sampling=sampling,
                    speculation=variant.speculation(),
                    drafters=list(variant.method.drafters) or None,
                )
            except Exception:  # the measured runs will record the failure
                pass

    def _pad(self, prompt: Prompt, ctx: int | None) -> Prompt:
        if ctx is None:
            return prompt
        tok = self.engine.tokenizer
        return pad_prompt(
            prompt,
            ctx,
            filler_for(prompt, self.filler_pool),
            lambda text: tok.encode(text, add_special=False),
            tok.decode,
        )

    def _warmup(self, prompt: Prompt) -> dict[str, dict]:
        """Decode a few tokens plainly and with each drafter: caches hold the prompt, code paths are hot.

        Returns per drafter ("" = plain) the warm-up's prefill and draft times: the plain
        one's prefill is the prompt's cold prefill cost, a model drafter's draft_ms its own.
        """
        messages = [{"role": "user", "content": prompt.turns[0]}]
        ids = self._fim_ids(prompt)
        sampling = SamplingParams(max_tokens=min(WARMUP_TOKENS, self.config.max_tokens), ignore_eos=True)
        needed = sorted({d for v in self.variants for d in v.method.drafters})
        out: dict[str, dict] = {}
        rss_before = current_rss_mb()
        for name in ["", *needed]:
            spec = (
                SpeculationConfig(enabled=False) if not name else SpeculationConfig(policy="fixed", max_draft_tokens=2)
            )
            if self.progress:
                self.progress.update(f"q{prompt.question_id} {prompt.category} · warm-up {name or 'plain'}")
            try:
                result = self.engine.generate(
                    messages=None if ids else messages,
                    prompt_ids=ids,
                    sampling=sampling,
                    speculation=spec,
                    drafters=[name] if name else None,
                )
            except Exception:  # the measured runs will record the failure
                continue
            out[name] = {
                "prefill_ms": result.stats.prefill_ms,
                "draft_ms": result.stats.draft_ms,
                "reused": result.stats.num_reused_tokens,
            }
            if not name:
                rss_before = current_rss_mb()
        if "draft_runtime_overhead_mb" not in self.memory and any(
            isinstance(self.drafter_objects[n], ModelDrafter) for n in out if n
        ):
            # NOTE: model weights are memory-mapped and count once touched, so the draft model's
            # share of RSS shows after its first use; measured once, on the first prompt.
            self.memory["draft_runtime_overhead_mb"] = round(max(0.0, current_rss_mb() - rss_before), 1)
        return out

    def _fim_ids(self, prompt: Prompt) -> list[int] | None:
        """A fill-in-the-middle prompt's ids (the prompt /infill builds); None for a chat prompt."""
        return None if prompt.suffix is None else fim_ids(self.engine.tokenizer, prompt)

    def _history_snapshot(self) -> dict:
        """The state of the drafters that learn from history (suffix trees)."""
        return {name: d.snapshot() for name, d in self.drafter_objects.items() if isinstance(d, SuffixDrafter)}

    def _history_restore(self, history: dict) -> None:
        for name, state in history.items():
            self.drafter_objects[name].restore(state)

    def _run_unit(
        self,
        prompt: Prompt,
        original: Prompt,
        ctx: int | None,
        temperature: float,
        cold: dict[str, dict],
        history_state: dict | None = None,
    ) -> list[dict]:
        cfg = self.config
        sampling = SamplingParams(
            temperature=temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            min_p=cfg.min_p,
            seed=cfg.seed,
            max_tokens=_max_tokens(original, cfg),
            ignore_eos=cfg.ignore_eos,
        )
        runs: dict[tuple[int, int], list[dict]] = {}
        # Baseline first: its answers become every method's conversation history, so later
        # turns pose the same task to every method. (Batched verification on llama.cpp can
        # flip a near-tie, docs/design.md section 7; a method's own, different answer would
        # otherwise change what the next turn measures.)
        order = sorted(
            range(len(self.variants)),
            key=lambda vi: (self.variants[vi].method.enabled, not self.variants[vi].method.constrained),
        )
        schema = original.json_schema
        traced = self._traced(original, ctx, temperature)
        ids = self._fim_ids(prompt)
        tools = original.tools
        plan = tool_calls.plan_for(self.engine.tokenizer, tools, original.tool_choice) if tools else None
        for _ in range(cfg.repeats):
            reference: dict[int, str] = {}  # turn -> the baseline's answer in this repeat
            for vi in order:
                variant = self.variants[vi]
                if history_state:
                    self._history_restore(history_state)
                history: list[dict] = []
                for turn, text in enumerate(prompt.turns):
                    if self.progress:
                        self.progress.update(
                            f"q{prompt.question_id} {prompt.category} · "
                            f"{_describe(variant)} · turn {turn + 1}/{len(prompt.turns)}"
                            + (f" · T={temperature:g}" if len(cfg.temperatures) > 1 else "")
                        )
                    messages = [*history, {"role": "user", "content": text}]
                    turn_ids, turn_sampling = ids, _constrained(sampling, schema, variant)
                    if plan is not None:  # the tools in the prompt, the calls' constraint (as the server does)
                        turn_ids = self.engine.encode_prompt(messages=messages, tools=tools)
                        if variant.method.constrained:
                            turn_sampling = replace(sampling, constraint=plan.constraint)
                    run = self._measure(
                        None if turn_ids else messages,
                        turn_sampling,
                        variant,
                        original.prediction_for(turn),
                        prompt_ids=turn_ids,
                        token_sources=traced and turn == 0,
                    )
                    runs.setdefault((vi, turn), []).append(run)
                    if self.progress:
                        self.progress.advance()
                    if run["error"]:
                        for later in range(turn + 1, len(prompt.turns)):
                            runs.setdefault((vi, later), []).append(
                                {"error": f"skipped: turn {turn} failed ({run['error']})"}
                            )
                            if self.progress:
                                self.progress.advance()
                        break
                    if not variant.method.enabled:
                        reference.setdefault(turn, run["text"])
                    answer = reference.get(turn, run["text"])
                    history = [*messages, {"role": "assistant", "content": answer}]
        records = [
            self._record(self.variants[vi], turn, tries, original, ctx, temperature, cold, plan)
            for (vi, turn), tries in sorted(runs.items())
        ]
        compare_with_baseline(records, greedy=temperature == 0.0)
        if temperature == 0.0:
            self._explain_differences(records)
        for r in records:
            r.pop("_token_ids", None)
            r.pop("_prompt", None)
            r.pop("_sampling", None)
        return records

    def _traced(self, prompt: Prompt, ctx: int | None, temperature: float) -> bool:
        """Whether this prompt's first answers keep their token sources (a per-token decode)."""
        cfg = self.config
        first_ctx = cfg.context_lengths[0] if cfg.context_lengths else None
        return (
            self.traced.get(prompt.category) == prompt.question_id
            and ctx == first_ctx
            and temperature == cfg.temperatures[0]
        )

    def _record(
        self,
        variant: Variant,
        turn: int,
        tries: list[dict],
        original: Prompt,
        ctx: int | None,
        temperature: float,
        cold: dict[str, dict],
        plan,
    ) -> dict:
        """One record: a variant's turn of a prompt at one setting, its median run kept whole
        (the lower one of an even count), scored against the prompt's schema, calls or middle."""
        cfg, schema = self.config, original.json_schema
        record = {
            "question_id": original.question_id,
            "category": original.category,
            "turn": turn,
            "method": variant.method.name,
            "policy_name": variant.method.policy if variant.method.enabled else "none",
            "drafters": list(variant.method.drafters),
            "k": variant.k,
            "draft_temperature": variant.draft_temperature,
            "branches": variant.branches,
            "temperature": temperature,
            "context_tokens": ctx,
            "seed": cfg.seed,
            "max_tokens": _max_tokens(original, cfg),
            "repeats": len(tries),
            "cold_prefill_ms": cold.get("", {}).get("prefill_ms"),
            # What that cold read took from the cache of the prompt before (a shared context).
            "cold_reused_tokens": cold.get("", {}).get("reused"),
            "cold_draft_ms": _cold_draft_ms(variant, cold, self._uses_model(variant)),
            "memory_overhead_mb": (
                self.memory.get("draft_overhead_mb", self.memory.get("draft_runtime_overhead_mb"))
                if self._uses_model(variant)
                else 0.0
            ),
            "constrained": (schema is not None or plan is not None) and variant.method.constrained,
        }
        failed = [t["error"] for t in tries if t["error"]]
        if failed:
            record.update(error=failed[0], speedup=None, identical_to_baseline=None)
        else:
            ordered = sorted(tries, key=lambda t: t["decode_tokens_per_second"])
            best = dict(ordered[(len(ordered) - 1) // 2])  # the (lower) median run, kept whole
            best["repeats_tokens_per_second"] = [t["decode_tokens_per_second"] for t in tries]
            record.update(best)
            if schema is not None:
                record.update(_validity(record["text"], schema))
            if plan is not None:
                record.update(tool_calls.scores(record["text"], plan, original.expected_calls or ()))
            if original.suffix is not None and isinstance(original.reference, str):
                record.update(quality(record["text"], original.reference))
        return record

    def _explain_differences(self, records: list[dict]) -> None:
        """For each greedy answer that differs from the baseline's, where and by how much: the
        first differing position, both tokens, and the gap between their logprobs in plain
        decoding's row there (plain decoding run again with logprobs, after the timed
        runs, see divergence()). A gap of a few hundredths of a nat is a near-tie that batched
        numerics can flip (docs/design.md section 7); a large one would be a bug."""
        base = {
            (r["turn"], r.get("constrained", False)): r
            for r in records
            if r["policy_name"] == "none" and not r.get("error")
        }
        for r in records:
            b = base.get((r["turn"], r.get("constrained", False)))
            if r.get("identical_to_baseline") is not False or b is None or b.get("_prompt") is None:
                continue
            try:
                ids, messages = b["_prompt"]
                ids = list(ids) if ids is not None else self.engine.encode_prompt(messages=messages)
                r["divergence"] = divergence(self.engine, ids, b["_token_ids"], r["_token_ids"], b.get("_sampling"))
            except Exception as exc:  # an explanation must not end the run
                r["divergence"] = {"error": f"{type(exc).__name__}: {exc}"}

    def _measure(
        self,
        messages: list[dict] | None,
        sampling: SamplingParams,
        variant: Variant,
        prediction: str | None = None,
        prompt_ids: list[int] | None = None,
        token_sources: bool = False,
    ) -> dict:
        engine = self.engine
        try:
            gen = engine.stream(
                messages=messages,
                prompt_ids=prompt_ids,
                sampling=sampling,
                speculation=variant.speculation(),
                drafters=list(variant.method.drafters) or None,
                prediction=prediction,
                token_sources=token_sources,
            )
            clock, competing = WindowClock(), CompetingLoad()
            for piece in gen:
                clock.piece(piece)
            wall_ms = 1000 * (time.perf_counter() - clock.start)
            result = gen.result
        except Exception as exc:  # one failing method must not end the run
            return {"error": f"{type(exc).__name__}: {exc}"}
        stats = result.stats
        windows = clock.windows(
            result.token_ids, engine.tokenizer.decode, stats.prefill_ms / 1000, self.config.window_tokens
        )
        run = {
            "error": None,
            "new_tokens": stats.num_generated,
            **stats.to_dict(),
            "decode_tokens_per_second": stats.tokens_per_second,
            "position_drafted": list(stats.position_drafted),
            "position_accepted": list(stats.position_accepted),
            "window_tokens": self.config.window_tokens,
            "tokens_per_second_windows": windows,
            "acceptance_windows": acceptance_windows(stats.step_tokens, self.config.window_tokens),
            # The first text's arrival, from the request (prompt read, or reused, and one step).
            "ttft_ms": round(1000 * clock.times[0], 3) if clock.times else None,
            "wall_ms": wall_ms,
            "load_avg_1m": round(os.getloadavg()[0], 2),  # includes the bench's own threads
            "other_cpu_share": round(competing.share(), 3),  # what other processes took of the machine
            "rss_mb": round(current_rss_mb(), 1),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            **self._memory(variant),
            "text": result.text,
            "_token_ids": list(result.token_ids),
            "_prompt": (prompt_ids, messages),  # encoded only if an answer differs (_explain_differences)
            "_sampling": sampling,
        }
        if result.spans is not None:
            run["spans"] = compact_spans(result.spans)
        return run


def _max_tokens(prompt: Prompt, config: BenchConfig) -> int:
    """The prompt's own answer length where its file sets one (the long suite's), else --max-tokens."""
    return prompt.max_tokens or config.max_tokens


def _mb(num_bytes: int) -> float:
    return round(num_bytes / 2**20, 1)


def _constrained(sampling: SamplingParams, schema: Any, variant: Variant) -> SamplingParams:
    """The prompt's JSON schema as the request's constraint, unless the method runs without it."""
    if schema is None or not variant.method.constrained:
        return sampling
    from draftwise.constraints import Constraint

    return replace(sampling, constraint=Constraint.json_schema(schema))


def _validity(text: str, schema: Any) -> dict:
    """json_valid: the answer parses as JSON; schema_valid: it also validates against the schema."""
    import jsonschema

    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {"json_valid": False, "schema_valid": False}
    return {"json_valid": True, "schema_valid": jsonschema.validators.validator_for(schema)(schema).is_valid(value)}


def _cold_draft_ms(variant: Variant, cold: dict[str, dict], uses_model: bool) -> float | None:
    if not uses_model:
        return None
    values = [cold[d]["draft_ms"] for d in variant.method.drafters if d in cold]
    return max(values) if values else None


def _describe(variant: Variant) -> str:
    parts = [variant.method.name]
    if variant.k is not None:
        parts.append(f"k={variant.k}")
    if variant.draft_temperature is not None:
        parts.append(f"dT={variant.draft_temperature:g}")
    if variant.branches > 1:
        parts.append(f"b={variant.branches}")
    return " ".join(parts)


def run_bench(engine, prompts: Sequence[Prompt], config: BenchConfig, out_dir: str | Path, **kwargs) -> dict:
    """Run the bench and return the results dict; results.json in out_dir is kept up to date."""
    return BenchRunner(engine, prompts, config, out_dir, **kwargs).run()
