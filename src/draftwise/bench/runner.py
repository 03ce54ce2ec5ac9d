"""The bench runner: prompts x methods x sweep settings through the public Engine API.

Per prompt (and padded context length): one short warm-up per drafter, so every
measured run starts with the prompt cached; then, per temperature, all method variants
run back to back on that prompt, `repeats` times, keeping the median run. results.json
is rewritten after every prompt, so an interrupted run keeps what it finished.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from draftwise.bench import tool_calls
from draftwise.bench.fim import fim_ids, quality
from draftwise.bench.methods import MethodSpec, parse_methods
from draftwise.bench.prompts import Prompt, filler_for, pad_prompt
from draftwise.bench.timing import CompetingLoad, WindowClock, current_rss_mb, host_info, peak_rss_mb
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig

FORMAT = "draftwise-bench/1"
WARMUP_TOKENS = 4


@dataclass(frozen=True)
class BenchConfig:
    """What to run. Each combination of temperature x k x draft_temperature is one record set.

    k and draft_temperature only apply to speculative methods (draft_temperature only to
    methods with a model drafter); baseline runs once per prompt and temperature.
    context_lengths pads prompts to about that many tokens (empty: no padding).
    """

    methods: tuple[str, ...] = ("baseline", "ngram")
    max_tokens: int = 256
    temperatures: tuple[float, ...] = (0.0,)
    ks: tuple[int, ...] = (4,)
    branches: tuple[int, ...] = (1,)
    draft_temperatures: tuple[float | None, ...] = (None,)
    repeats: int = 1
    context_lengths: tuple[int, ...] = ()
    seed: int = 0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    ignore_eos: bool = False
    window_tokens: int = 32

    def __post_init__(self) -> None:
        for name in ("methods", "temperatures", "ks", "branches", "draft_temperatures", "context_lengths"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.methods:
            raise ConfigError("methods: give at least one method")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ConfigError(f"temperatures must be >= 0, got {list(self.temperatures)}")
        if not self.ks or any(not 1 <= k <= 256 for k in self.ks):
            raise ConfigError(f"k values must be in [1, 256], got {list(self.ks)}")
        if not self.branches or any(not 1 <= b <= 16 for b in self.branches):
            raise ConfigError(f"branches must be in [1, 16], got {list(self.branches)}")
        if not self.draft_temperatures or any(t is not None and t < 0 for t in self.draft_temperatures):
            raise ConfigError(
                f"draft temperatures must be >= 0 (or None: same as the target), got {list(self.draft_temperatures)}"
            )
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(n < 16 for n in self.context_lengths):
            raise ConfigError(f"context lengths must be >= 16 tokens, got {list(self.context_lengths)}")
        if self.window_tokens < 1:
            raise ConfigError(f"window_tokens must be >= 1, got {self.window_tokens}")
        for name in ("temperatures", "ks", "branches", "draft_temperatures", "context_lengths"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ConfigError(f"{name}: a value is given twice in {list(values)}")
        SamplingParams(top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)  # validates the filters

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Variant:
    """One way of decoding a prompt: a method at one k and draft temperature."""

    method: MethodSpec
    k: int | None = None
    draft_temperature: float | None = None
    branches: int = 1

    def speculation(self) -> SpeculationConfig:
        return self.method.speculation(self.k or 1, self.draft_temperature, self.branches)


class ProgressSink(Protocol):
    def start(self, total: int) -> None: ...
    def update(self, description: str) -> None: ...
    def advance(self, n: int = 1) -> None: ...
    def close(self) -> None: ...


class RichProgress:
    """A rich progress bar on stderr: prompt, method, done/total, elapsed and ETA."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self._task = None

    def start(self, total: int) -> None:
        self._bar.start()
        self._task = self._bar.add_task("bench", total=total)

    def update(self, description: str) -> None:
        self._bar.update(self._task, description=description)

    def advance(self, n: int = 1) -> None:
        self._bar.advance(self._task, n)

    def close(self) -> None:
        self._bar.stop()


# ---------------------------------------------------------------------------- results file
def save_results(path: Path, results: dict) -> None:
    """Write atomically (temp file + rename): a crash mid-write never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, allow_nan=False))
    os.replace(tmp, path)


def load_results(path: Path) -> dict:
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}); cannot resume") from None
    if results.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a draftwise bench results file (format {results.get('format')!r})")
    return results


def unit_key(question_id: int, context_tokens: int | None, temperature: float) -> tuple:
    """A prompt at one context length and temperature: the unit that is saved (and resumed) whole."""
    return (int(question_id), context_tokens, float(temperature))


# ---------------------------------------------------------------------------- the runner
class BenchRunner:
    """Runs a BenchConfig on an engine; `run()` returns the results dict (also on disk)."""

    def __init__(
        self,
        engine,
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
        meta = dict(meta or {})
        meta.setdefault("drafters", list(self.drafter_objects))
        meta.setdefault("host", host_info())
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if resume and self.path.exists():
            self.results = load_results(self.path)
            _check_same_run(self.results, config, meta, self.path)
            self.results["complete"] = False
        elif self.path.exists() and not resume:
            raise ConfigError(f"{self.path} already exists; pass --resume to continue it or choose another --out")
        else:
            meta["started_at"] = _now()
            self.results = {
                "format": FORMAT,
                "config": _norm(config.to_dict()),
                "meta": _norm(meta),
                "complete": False,
                "records": [],
            }
        self.memory = self.results["meta"].setdefault("memory", {})

    def _variants(self) -> list[Variant]:
        out = []
        for m in self.methods:
            if not m.enabled:
                out.append(Variant(m))
                continue
            samples = any(not getattr(self.drafter_objects[d], "free", True) for d in m.drafters)
            # Token trees: only the fixed policy with a drafter that proposes them.
            trees = m.policy == "fixed" and all(hasattr(self.drafter_objects[d], "propose_tree") for d in m.drafters)
            for k in self.config.ks:
                for dt in self.config.draft_temperatures if samples else (None,):
                    for b in self.config.branches if trees else (1,):
                        out.append(Variant(m, k, dt, b))
        return out

    def _uses_model(self, variant: Variant) -> bool:
        return any(getattr(self.drafter_objects[d], "backend", None) is not None for d in variant.method.drafters)

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
                        self.results["records"].extend(_norm(records))
                        save_results(self.path, self.results)
            self.results["complete"] = True
            self.results["meta"]["finished_at"] = _now()
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
        calibration = cached_calibration(self.engine)
        if calibration:
            self.results["meta"]["calibration"] = {name: points for name, (points, _) in calibration.items()}
            # Where each curve was timed and how it grows with context (replay prices by it).
            self.results["meta"]["calibration_context"] = {name: ctx for name, (_, ctx) in calibration.items()}

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
            out[name] = {"prefill_ms": result.stats.prefill_ms, "draft_ms": result.stats.draft_ms}
            if not name:
                rss_before = current_rss_mb()
        if "draft_runtime_overhead_mb" not in self.memory and any(
            getattr(self.drafter_objects[n], "backend", None) is not None for n in out if n
        ):
            # NOTE: model weights are memory-mapped and count once touched, so the draft model's
            # share of RSS shows after its first use; measured once, on the first prompt.
            self.memory["draft_runtime_overhead_mb"] = round(max(0.0, current_rss_mb() - rss_before), 1)
        return out

    def _fim_ids(self, prompt: Prompt) -> list[int] | None:
        """A fill-in-the-middle prompt's ids (the prompt /infill builds); None for a chat prompt."""
        return None if prompt.suffix is None else fim_ids(self.engine.tokenizer, prompt)

    def _history_snapshot(self) -> dict:
        return {name: d.snapshot() for name, d in self.drafter_objects.items() if hasattr(d, "snapshot")}

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
            max_tokens=cfg.max_tokens,
            ignore_eos=cfg.ignore_eos,
        )
        runs: dict[tuple[int, int], list[dict]] = {}
        # Baseline first: its answers become every method's conversation history, so later
        # turns pose the same task to every method. (Batched verification on llama.cpp can
        # flip a near-tie, DESIGN.md section 7; a method's own, different answer would
        # otherwise change what the next turn measures.)
        order = sorted(
            range(len(self.variants)),
            key=lambda vi: (self.variants[vi].method.enabled, not self.variants[vi].method.constrained),
        )
        schema = original.json_schema
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
        records = []
        for (vi, turn), tries in sorted(runs.items()):
            variant = self.variants[vi]
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
                "max_tokens": cfg.max_tokens,
                "repeats": len(tries),
                "cold_prefill_ms": cold.get("", {}).get("prefill_ms"),
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
            records.append(record)
        _compare_with_baseline(records, greedy=temperature == 0.0)
        if temperature == 0.0:
            self._explain_differences(records)
        for r in records:
            r.pop("_token_ids", None)
            r.pop("_prompt", None)
            r.pop("_sampling", None)
        return records

    def _explain_differences(self, records: list[dict]) -> None:
        """For each greedy answer that differs from the baseline's, where and by how much: the
        first differing position, both tokens, and the gap between their logprobs in plain
        decoding's row there (plain decoding run again with logprobs, after the timed
        runs, see divergence()). A gap of a few hundredths of a nat is a near-tie that batched
        numerics can flip (DESIGN.md section 7); a large one would be a bug."""
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
        return {
            "error": None,
            "new_tokens": stats.num_generated,
            **stats.to_dict(),
            "decode_tokens_per_second": stats.tokens_per_second,
            "position_drafted": list(stats.position_drafted),
            "position_accepted": list(stats.position_accepted),
            "window_tokens": self.config.window_tokens,
            "tokens_per_second_windows": windows,
            "wall_ms": wall_ms,
            "load_avg_1m": round(os.getloadavg()[0], 2),  # includes the bench's own threads
            "other_cpu_share": round(competing.share(), 3),  # what other processes took of the machine
            "rss_mb": round(current_rss_mb(), 1),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "text": result.text,
            "_token_ids": list(result.token_ids),
            "_prompt": (prompt_ids, messages),  # encoded only if an answer differs (_explain_differences)
            "_sampling": sampling,
        }


def divergence(
    engine, prompt_ids: list[int], plain: list[int], other: list[int], sampling: SamplingParams | None = None
) -> dict:
    """Where answer `other` leaves `plain` (greedy plain decoding's, under `sampling`'s
    constraint) and the logprob gap there: {"position", "plain_token", "other_token" (texts),
    "gap_nats": logprob(plain's token) - logprob(other's) in plain decoding's own row at that
    position (None: other's token is not among the row's 20 most likely), "reproduced"}. The row
    is plain decoding's own: plain decoding runs again, a token per forward from the cached
    prompt as it first ran, with logprobs (reproduced: it gave the same tokens up to there; when
    it did not, "forced": the row is read after plain's first i tokens given as prompt).
    Example: a gap of 0.02 is a near-tie."""
    i = next((j for j, (a, b) in enumerate(zip(plain, other)) if a != b), min(len(plain), len(other)))
    out: dict = {"position": i, "plain_token": None, "other_token": None, "gap_nats": None}
    if i >= len(plain) or i >= len(other):  # one answer is the other's prefix: it stopped earlier
        out["note"] = "one answer ends where the other goes on"
        return out
    base = sampling or SamplingParams()
    probe = engine.generate(
        prompt_ids=prompt_ids,
        sampling=replace(base, temperature=0.0, max_tokens=i + 1, logprobs=20, ignore_eos=True, stop=()),
        speculation=SpeculationConfig(enabled=False),
    )
    decode = engine.tokenizer.decode
    out.update(plain_token=decode([plain[i]]), other_token=decode([other[i]]))
    out["reproduced"] = list(probe.token_ids[: i + 1]) == list(plain[: i + 1])
    at = probe.logprobs[i] if probe.logprobs and len(probe.logprobs) > i else None
    if not out["reproduced"]:
        # Plain decoding run again took another path before i (its cache was filled otherwise:
        # llama.cpp's rows then round differently), so its row i has another context. The row
        # after plain's own first i tokens, read as part of the prompt, has the right one.
        forced = engine.generate(
            prompt_ids=list(prompt_ids) + list(plain[:i]),
            sampling=replace(base, temperature=0.0, max_tokens=1, logprobs=20, ignore_eos=True, stop=()),
            speculation=SpeculationConfig(enabled=False),
        )
        at, out["forced"] = (forced.logprobs[0] if forced.logprobs else None), True
    if at is not None:
        row = dict(at.top)
        if plain[i] in row and other[i] in row:
            out["gap_nats"] = round(row[plain[i]] - row[other[i]], 4)
    return out


def cached_calibration(engine) -> dict:
    """Per model, (n -> ms, {context_len, growth}) of the calibrated cost curves already cached on
    disk for the engine's models; never measures."""
    try:
        from draftwise import calibrate
    except ImportError:
        return {}
    out = {}
    backends = [("target", getattr(engine, "target", None))] + [
        (d.name, getattr(d, "backend", None)) for d in engine.drafters
    ]
    for name, backend in backends:
        if backend is None:
            continue
        try:
            path = calibrate.cache_file(backend)
            if path.is_file():
                curve = calibrate.CostCurve.from_dict(json.loads(path.read_text()))
                out[name] = (
                    {str(n): round(ms, 4) for n, ms in curve.points},
                    {"context_len": curve.context_len, "growth": list(curve.growth)},
                )
        except Exception:  # a missing or changed calibration format only loses a plot line
            continue
    return out


def _compare_with_baseline(records: list[dict], greedy: bool) -> None:
    """speedup = decode tok/s over the same prompt and turn's baseline; identical: greedy only.

    speedup_drift_corrected measures each run's time in units of its own plain (k = 0) step
    time, so a machine that slows down or speeds up between two runs (shared, noisy) cancels;
    None when either run has fewer than MIN_PLAIN_STEPS plain steps to time that unit.
    """
    base = {
        (r["turn"], r.get("constrained", False)): r
        for r in records
        if r["policy_name"] == "none" and not r.get("error")
    }
    for r in records:
        if r.get("error"):
            continue
        b = base.get((r["turn"], r.get("constrained", False)))
        if b is None:
            r["speedup"], r["identical_to_baseline"] = None, None
            continue
        b_tps = b["decode_tokens_per_second"]
        r["speedup"] = r["decode_tokens_per_second"] / b_tps if b_tps > 0 else None
        r_rate, b_rate = _tokens_per_plain_step(r), _tokens_per_plain_step(b)
        r["speedup_drift_corrected"] = r_rate / b_rate if r_rate and b_rate else None
        r["identical_to_baseline"] = (r["_token_ids"] == b["_token_ids"]) if greedy else None
        free = base.get((r["turn"], False))  # a constrained run against the plain unconstrained one
        if r.get("constrained") and free is not None and free["decode_tokens_per_second"] > 0:
            r["speedup_vs_unconstrained"] = r["decode_tokens_per_second"] / free["decode_tokens_per_second"]


MIN_PLAIN_STEPS = 8


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


def _tokens_per_plain_step(r: dict) -> float | None:
    """Generated tokens per (mean plain step time) of decoding: a machine-speed-free rate."""
    plain = r.get("num_plain_steps", 0)
    if plain < MIN_PLAIN_STEPS or not r.get("decode_ms") or not r.get("plain_step_ms"):
        return None
    return r["num_generated"] * (r["plain_step_ms"] / plain) / r["decode_ms"]


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


def _check_same_run(results: dict, config: BenchConfig, meta: dict, path: Path) -> None:
    old, new = results.get("config", {}), config.to_dict()
    for key in new:
        if _norm(old.get(key)) != _norm(new[key]):
            raise ConfigError(
                f"cannot resume {path}: {key} was {old.get(key)!r}, now {new[key]!r}; "
                "use the same settings or another --out"
            )
    for key in ("target", "draft_model"):
        if key in meta and results.get("meta", {}).get(key) != meta[key]:
            raise ConfigError(f"cannot resume {path}: {key} was {results['meta'].get(key)!r}, now {meta[key]!r}")


def _norm(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=False))  # as stored: tuples -> lists, int keys -> str


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_bench(engine, prompts: Sequence[Prompt], config: BenchConfig, out_dir: str | Path, **kwargs) -> dict:
    """Run the bench and return the results dict; results.json in out_dir is kept up to date."""
    return BenchRunner(engine, prompts, config, out_dir, **kwargs).run()


# ---------------------------------------------------------------------------- loading with memory probes
@dataclass
class LoadedBench:
    engine: Any
    memory: dict = field(default_factory=dict)
    calibration_ms: float = 0.0  # measuring cost curves at load (0.0: cached), never in a timed run


def load_bench_engine(
    target: str,
    draft_model: str | None,
    *,
    need_draft: bool,
    options,
    progress=None,
    datastore: str | None = None,
    auto_only: bool = False,
    calibrate: bool = False,
    calibration_progress=None,
) -> LoadedBench:
    """Load the target with every free drafter and, only if a method needs it, the draft model
    (through loading.load, which decides what is loaded and skipped).

    Resident memory is read before loading, after the target has decoded a few tokens,
    and after the draft model has too (mapped weights count once touched), so the draft
    model's memory overhead is the difference: target+draft minus target alone. When only
    auto methods want it (auto_only), a draft model that cannot pay here is not kept, as
    under the auto policy anywhere: the memory column then shows what the default costs.
    calibrate: the cost curves auto methods price with are measured (or read) at load.
    """
    from draftwise.engine import Engine
    from draftwise.loading import FREE_DRAFTERS, load

    if need_draft and not draft_model:
        raise ConfigError("a method needs the draft model, but none is set (--draft-model)")
    memory = {"rss_start_mb": round(current_rss_mb(), 1)}

    def target_alone(backend) -> None:
        _touch(Engine(backend), None)
        memory["rss_target_mb"] = round(current_rss_mb(), 1)
        memory["target_overhead_mb"] = round(memory["rss_target_mb"] - memory["rss_start_mb"], 1)

    loaded = load(
        target,
        ",".join([*FREE_DRAFTERS, *([draft_model] if need_draft else [])]),
        options=options,
        speculation=SpeculationConfig(policy="auto" if auto_only else "fixed"),
        progress=progress,
        datastore=datastore,
        calibrate=calibrate,
        calibration_progress=calibration_progress,
        on_target=target_alone,
    )
    engine = loaded.engine
    if "draft" in engine.skipped_drafters:
        memory["draft_skipped"] = engine.skipped_drafters["draft"]
    elif need_draft:
        _touch(engine, "draft")
        memory["rss_target_and_draft_mb"] = round(current_rss_mb(), 1)
        memory["draft_overhead_mb"] = round(memory["rss_target_and_draft_mb"] - memory["rss_target_mb"], 1)
    memory["peak_rss_after_load_mb"] = round(peak_rss_mb(), 1)
    return LoadedBench(engine, memory, loaded.calibration.ms)


def _touch(engine, drafter: str | None) -> None:
    """A few tokens decoded, so the model's mapped weights count in resident memory (a fixed
    policy: a plain run needs no calibration)."""
    spec = SpeculationConfig(policy="fixed", enabled=drafter is not None, max_draft_tokens=2)
    engine.generate(
        "The quick brown fox jumps over the lazy dog. " * 4,
        sampling=SamplingParams(max_tokens=8),
        speculation=spec,
        drafters=[drafter] if drafter else None,
    )
