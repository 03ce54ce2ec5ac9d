"""Bench method names -> how to call the engine (policy, drafters, speculation on/off).

`baseline` is plain decoding; `draft` / `ngram` are one drafter at fixed k; `heuristic`
uses the draft model (else the first drafter there is); `auto` uses every drafter.
Combinations: `ngram+draft` (auto policy choosing between them) or `POLICY:D1+D2`. On prompts
with a JSON schema every method is constrained by it; `METHOD@unconstrained` runs without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from draftwise.types import POLICIES, ConfigError, SpeculationConfig

KEYWORDS = ("baseline", "draft", "ngram", "suffix", "prediction", "datastore", "heuristic", "auto")
UNCONSTRAINED = "@unconstrained"


@dataclass(frozen=True)
class MethodSpec:
    name: str  # as written on the command line
    policy: str
    drafters: tuple[str, ...] = ()
    enabled: bool = True
    constrained: bool = True  # follow the prompt's JSON schema, if it has one

    def speculation(self, k: int, draft_temperature: float | None, branches: int = 1) -> SpeculationConfig:
        if not self.enabled:
            return SpeculationConfig(enabled=False)
        return SpeculationConfig(
            policy=self.policy, max_draft_tokens=k, draft_temperature=draft_temperature, max_branches=branches
        )


def parse_method(name: str, available: Sequence[str]) -> MethodSpec:
    """One method name -> MethodSpec, given the drafter names that can be loaded.

    Example: parse_method("heuristic:ngram", ["ngram", "draft"])
    -> MethodSpec("heuristic:ngram", "heuristic", ("ngram",)).
    """
    name = name.strip()
    available = list(available)
    if name.endswith(UNCONSTRAINED) and len(name) > len(UNCONSTRAINED):
        from dataclasses import replace

        return replace(parse_method(name[: -len(UNCONSTRAINED)], available), name=name, constrained=False)
    if name == "baseline":
        return MethodSpec(name, "fixed", (), enabled=False)
    if name in ("draft", "ngram", "suffix", "prediction", "datastore"):
        return MethodSpec(name, "fixed", _known((name,), available, name))
    if name == "heuristic":
        if not available:
            raise ConfigError("method 'heuristic' needs a drafter, but none is loaded")
        return MethodSpec(name, "heuristic", ("draft",) if "draft" in available else (available[0],))
    if name == "auto":
        if not available:
            raise ConfigError("method 'auto' needs a drafter, but none is loaded")
        return MethodSpec(name, "auto", tuple(available))
    policy, sep, rest = name.partition(":")
    if not sep and "+" not in name and name not in available:
        raise ConfigError(
            f"unknown method {name!r}; methods are {', '.join(KEYWORDS)}, a loaded drafter "
            f"({', '.join(available) or 'none'}), D1+D2 or POLICY:D1+D2"
        )
    if not sep:
        policy, rest = "auto", name
    if policy not in POLICIES:
        raise ConfigError(
            f"unknown method {name!r}: {policy!r} is not a policy ({', '.join(POLICIES)}); "
            f"methods are {', '.join(KEYWORDS)}, D1+D2 or POLICY:D1+D2"
        )
    drafters = tuple(d.strip() for d in rest.split("+") if d.strip())
    if not drafters:
        raise ConfigError(f"method {name!r} names no drafter")
    if len(set(drafters)) != len(drafters):
        raise ConfigError(f"method {name!r} names a drafter twice")
    if policy in ("fixed", "heuristic") and len(drafters) > 1:
        raise ConfigError(f"method {name!r}: the {policy} policy uses one drafter; only auto chooses among several")
    return MethodSpec(name, policy, _known(drafters, available, name))


def parse_methods(spec: str | Sequence[str], available: Sequence[str]) -> list[MethodSpec]:
    """'baseline,draft,ngram' -> [MethodSpec, ...]; names must be unique."""
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [s.strip() for s in spec]
    names = [n for n in names if n]
    if not names:
        raise ConfigError("no methods given")
    if len(set(names)) != len(names):
        raise ConfigError(f"a method is named twice in {names}")
    return [parse_method(n, available) for n in names]


def _known(drafters: tuple[str, ...], available: list[str], method: str) -> tuple[str, ...]:
    missing = [d for d in drafters if d not in available]
    if missing:
        have = ", ".join(available) or "none"
        raise ConfigError(f"method {method!r} needs drafter {missing[0]!r}, which is not loaded (loaded: {have})")
    return drafters
