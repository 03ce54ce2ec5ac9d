"""What a bench run runs (BenchConfig: methods, sweeps, repeats; validated when built) and one
way of decoding a prompt among them (Variant: a method at one k, draft temperature, branches)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from draftwise.bench.sweep.methods import MethodSpec
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig


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
            object.__setattr__(self, name, tuple(vars(self)[name]))
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
            values = vars(self)[name]
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
