"""Build backends, drafters and an Engine from user-facing names (CLI, bench, server).

A model is a registry name (fetched on first use), a GGUF file or a transformers
model directory. Drafters are named "ngram", "suffix", "grammar", "none", or a draft model; several
can be given comma-separated ("ngram,qwen2.5-coder-0.5b-instruct") for the auto policy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from draftwise import models
from draftwise.backends.base import Backend, num_slots
from draftwise.backends.hf import DEVICES, DTYPES
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.calls import CallsDrafter
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.drafters.prediction import PredictionDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.engine import Engine, check_tokenizers
from draftwise.types import ConfigError, SpeculationConfig

BACKENDS = ("auto", "llamacpp", "hf")
# Slots `serve` opens on llama.cpp unless told: 4 concurrent streams on a CPU is where batching
# still raises throughput here (docs/bench/serve) without stretching each stream's steps far.
DEFAULT_SLOTS = 4


@dataclass(frozen=True)
class LoadOptions:
    backend: str = "auto"  # llamacpp for .gguf files, hf for model directories
    n_ctx: int = 4096
    threads: int | None = None
    dtype: str = "float32"  # hf only
    device: str = "cpu"  # hf only
    ngram_min: int = 2
    ngram_max: int = 4
    n_seq_max: int = 1  # llama.cpp sequences for token-tree verification (target only)
    slots: int = 1  # requests decoded together (continuous batching); 0: the backend's default

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device not in DEVICES and not self.device.startswith("cuda:"):
            raise ConfigError(f"device must be one of {', '.join(DEVICES)} (or cuda:N), got {self.device!r}")
        if self.n_ctx < 16:
            raise ConfigError(f"n_ctx must be >= 16, got {self.n_ctx}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        if self.slots < 0:
            raise ConfigError(f"parallel slots must be >= 1 (or 0 for the machine's default), got {self.slots}")
        if self.slots > 1 and self.n_seq_max > 1:
            raise ConfigError("token trees (--branches > 1) and parallel slots cannot be combined")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError(f"ngram sizes need 1 <= min <= max, got {self.ngram_min}..{self.ngram_max}")


def backend_kind(path: Path, options: LoadOptions) -> str:
    """ "llamacpp" or "hf": as asked, or for "auto" by the model: a directory is a transformers model."""
    if options.backend != "auto":
        return options.backend
    return "hf" if Path(path).expanduser().is_dir() else "llamacpp"


def default_slots(kind: str, options: LoadOptions) -> int:
    """What slots=0 (`--parallel 0`) means: batching on llama.cpp, one request at a time on
    transformers or with token trees."""
    return DEFAULT_SLOTS if kind == "llamacpp" and options.n_seq_max == 1 else 1


def load_backend(spec: str, options: LoadOptions = LoadOptions(), progress=None) -> Backend:
    path = models.resolve(spec, progress=progress)
    kind = backend_kind(path, options)
    name = spec if spec in models.REGISTRY else Path(spec).name
    if options.slots == 0:
        options = replace(options, slots=default_slots(kind, options))
    if kind == "llamacpp":
        if path.is_dir():
            raise ConfigError(f"{path} is a directory; the llama.cpp backend needs a .gguf file (or use --backend hf)")
        from draftwise.backends.llamacpp import LlamaCppBackend

        return LlamaCppBackend(
            path,
            n_ctx=options.n_ctx,
            n_threads=options.threads,
            name=name,
            n_seq_max=options.n_seq_max,
            slots=options.slots,
        )
    from draftwise.backends.hf import HFBackend

    return HFBackend(
        path,
        dtype=options.dtype,
        device=options.device,
        n_ctx=options.n_ctx,
        n_threads=options.threads,
        name=name,
        slots=options.slots,
    )


def parse_drafters(spec: str | None) -> list[str]:
    """'ngram,qwen' -> ['ngram', 'qwen']; 'none' or '' -> []. Free drafters: ngram, suffix."""
    if not spec:
        return []
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if "none" in names:
        if len(names) > 1:
            raise ConfigError("--draft none cannot be combined with other drafters")
        return []
    return names


FREE_DRAFTERS = ("ngram", "suffix", "grammar", "prediction", "calls")


def free_drafter(name: str, options: LoadOptions = LoadOptions()):
    """A free (lookup) drafter by name: "ngram", "suffix", "grammar", "prediction" or "calls"."""
    if name == "ngram":
        return NgramDrafter(options.ngram_min, options.ngram_max)
    if name == "suffix":
        return SuffixDrafter()
    if name == "grammar":
        return GrammarDrafter()
    if name == "prediction":
        return PredictionDrafter()
    if name == "calls":
        return CallsDrafter()
    raise ConfigError(f"unknown free drafter {name!r}; choose from {', '.join(FREE_DRAFTERS)}")


def draft_model_verdict(target: Backend, draft: Backend, speculation: SpeculationConfig | None) -> str:
    """Why a draft model is not worth its memory here ('' if it may pay, or the policy is not auto).

    From both models' calibrated costs (measured once, cached). The auto policy starts a draft
    model's estimate at DRAFT_MODEL_PRIOR acceptance per token and learns it only from the
    steps that draft with it; if at that acceptance no k beats plain decoding by MIN_GAIN, the
    policy never drafts with it, so it never learns otherwise, and keeping the model loaded
    costs its memory for nothing. The message also gives the most it could gain (every token
    accepted), which is the figure to compare with a host where it pays.
    """
    from draftwise.calibrate import load_or_measure
    from draftwise.policy.auto import DRAFT_MODEL_PRIOR, MAX_K, MIN_GAIN, draft_speedup

    if speculation is not None and speculation.policy != "auto":
        return ""
    target_cost, draft_cost = load_or_measure(target, max_n=MAX_K + 1), load_or_measure(draft, max_n=MAX_K)
    at_prior, _ = draft_speedup(target_cost, draft_cost, DRAFT_MODEL_PRIOR)
    if at_prior > MIN_GAIN:
        return ""
    best, k = draft_speedup(target_cost, draft_cost)
    if best <= MIN_GAIN:
        return (
            f"not loaded: even with every draft token accepted it would run at {best:.2f}x of plain decoding "
            f"on this machine (best k = {k}, from the calibrated costs), below the {MIN_GAIN:.2f}x the auto "
            "policy needs; --policy fixed loads it anyway"
        )
    return (
        f"not loaded: the auto policy would never draft with it on this machine: at the acceptance it starts "
        f"from ({DRAFT_MODEL_PRIOR:.2f} per token) it would run at {at_prior:.2f}x of plain decoding, below the "
        f"{MIN_GAIN:.2f}x it needs (with every token accepted {best:.2f}x at k = {k}, from the calibrated "
        "costs); --policy fixed loads it anyway"
    )


def datastore_drafter(path: str):
    from draftwise.drafters.datastore import DatastoreDrafter

    return DatastoreDrafter(path)


def load_engine(
    target: str = models.DEFAULT_TARGET,
    draft: str | None = "ngram",
    *,
    options: LoadOptions = LoadOptions(),
    speculation: SpeculationConfig | None = None,
    progress=None,
    draft_options: LoadOptions | None = None,
    datastore: str | None = None,
) -> Engine:
    """Load the target, the drafters and an Engine. Raises ConfigError/ModelError/BackendError.

    Under the auto policy (the default) a draft model the policy would never draft with on this
    machine is unloaded again after calibration (see draft_model_verdict); `engine.skipped_drafters`
    says why.
    """
    drafter_names = parse_drafters(draft)
    target_backend = load_backend(target, options, progress)
    drafters, skipped = [], {}
    try:
        for name in drafter_names:
            if name in FREE_DRAFTERS:
                drafters.append(free_drafter(name, options))
                continue
            # The draft follows the target's slots: a slot's requests draft on its own sequence.
            draft_backend = load_backend(
                name, draft_options or replace(options, n_seq_max=1, slots=num_slots(target_backend)), progress
            )
            try:
                check_tokenizers(target_backend, draft_backend)  # before any calibration of a useless draft
            except BaseException:
                draft_backend.close()
                raise
            reason = draft_model_verdict(target_backend, draft_backend, speculation)
            if reason:
                draft_backend.close()
                skipped["draft"] = reason
            else:
                drafters.append(ModelDrafter(draft_backend, name="draft"))
        if datastore:
            drafters.append(datastore_drafter(datastore))
        engine = Engine(target_backend, drafters, speculation=speculation)
        engine.skipped_drafters = skipped
        return engine
    except BaseException:
        target_backend.close()
        for d in drafters:
            backend = getattr(d, "backend", None)
            if backend is not None:
                backend.close()
        raise
