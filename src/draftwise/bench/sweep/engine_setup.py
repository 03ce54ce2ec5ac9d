"""The bench's engine: loaded through draftwise.loading.load (which decides the drafters), with
resident-memory probes between the models, and the cost curves a run's report and replay read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from draftwise.bench.record.timing import current_rss_mb, peak_rss_mb
from draftwise.loading import Calibration
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig


@dataclass
class LoadedBench:
    engine: Any
    memory: dict = field(default_factory=dict)
    # The cost curves measured (or read) at load, before any timed run.
    calibration: Calibration = field(default_factory=Calibration)


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
    return LoadedBench(engine, memory, loaded.calibration)


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


def calibration_meta(calibration: Calibration) -> dict:
    """What a run's meta keeps of the load's calibration: per model the curve's {n: ms}
    (calibration), where it was timed and how it grows with context (calibration_context; the
    replay prices by it), and the time measuring took (calibration_ms, 0.0: cached)."""
    curves = calibration.curves
    return {
        "calibration_ms": calibration.ms,
        **(
            {
                "calibration": {name: {str(n): round(ms, 4) for n, ms in c.points} for name, c in curves.items()},
                "calibration_context": {
                    name: {"context_len": c.context_len, "growth": list(c.growth), "growth_one": c.growth_one}
                    for name, c in curves.items()
                },
            }
            if curves
            else {}
        ),
    }
