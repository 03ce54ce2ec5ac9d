"""Build backends, drafters and an Engine from user-facing names (CLI, bench, server).

A model is a registry name (fetched on first use), a GGUF file, a transformers model
directory, or a model in the user's stores (Ollama's "qwen2.5-coder:7b": draftwise.stores).
Drafters are named "ngram", "suffix", "grammar", "none", or a draft model; several can be given
comma-separated ("ngram,qwen2.5-coder-0.5b-instruct") for the auto policy. Models the
auto policy prices are calibrated here, before anything is timed (calibrate_models).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from draftwise import calibrate, models, pairing, stores
from draftwise.backends.base import Backend, num_slots, text_marks
from draftwise.backends.hf import DEVICES, DTYPES
from draftwise.calibrate import CostCurve
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.drafters.base import Drafter
from draftwise.drafters.calls import CallsDrafter
from draftwise.drafters.crossvocab import PROMPT_MODES, CrossVocabDrafter, VocabMap, shared_vocabulary
from draftwise.drafters.grammar import GrammarDrafter
from draftwise.drafters.prediction import PredictionDrafter
from draftwise.drafters.stringlevel import DRAFT_LEVELS
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.engine import Engine, TokenizerMismatchError, check_tokenizers
from draftwise.policy.auto import DRAFT_MODEL_PRIOR, MIN_GAIN, draft_speedup
from draftwise.policy.cost import MAX_K
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
    draft_prompt: str = "template"  # a draft of another vocabulary: crossvocab.PROMPT_MODES
    draft_level: str = "auto"  # a draft of another vocabulary: stringlevel.DRAFT_LEVELS
    chat_template: str | None = None  # llama.cpp: a built-in template's name or a Jinja file (the GGUF's own: None)
    models_dirs: tuple[str, ...] = ()  # folders of GGUF files to find models in, beside the stores

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
        if self.draft_prompt not in PROMPT_MODES:
            raise ConfigError(f"draft_prompt must be one of {', '.join(PROMPT_MODES)}, got {self.draft_prompt!r}")
        if self.draft_level not in DRAFT_LEVELS:
            raise ConfigError(f"draft_level must be one of {', '.join(DRAFT_LEVELS)}, got {self.draft_level!r}")
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
    resolved = stores.resolve(spec, options.models_dirs, progress=progress)
    path, name = resolved.path, resolved.name
    kind = backend_kind(path, options)
    if options.slots == 0:
        options = replace(options, slots=default_slots(kind, options))
    if kind == "llamacpp":
        if path.is_dir():
            raise ConfigError(f"{path} is a directory; the llama.cpp backend needs a .gguf file (or use --backend hf)")
        from draftwise.backends.llamacpp import LlamaCppBackend

        stores.check_loadable(path, options.n_ctx, options.slots)  # a corrupt file or too little memory, by name
        return LlamaCppBackend(
            path,
            n_ctx=options.n_ctx,
            n_threads=options.threads,
            name=name,
            n_seq_max=options.n_seq_max,
            slots=options.slots,
            chat_template=options.chat_template,
        )
    if options.chat_template:
        raise ConfigError("--chat-template is for GGUF models (llama.cpp); a transformers model uses its own")
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


# Told (model, rounds done, rounds in all) while a model's forward cost is measured; model is
# "target" or a drafter's name. Never told when every curve is cached.
CalibrationProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Calibration:
    """The cost curves the auto policy prices with, measured or read before anything is timed.

    ms: time spent measuring (0.0: every curve was cached); measured: the models measured.
    """

    curves: Mapping[str, CostCurve] = field(default_factory=dict)
    ms: float = 0.0
    measured: tuple[str, ...] = ()


def calibrate_models(
    target: Backend, drafts: Mapping[str, Backend] = {}, progress: CalibrationProgress | None = None
) -> Calibration:
    """The target's and each draft model's cost curve (calibrate.load_or_measure: cached, or
    measured now, for the longest draft the auto policy plans); the target vocabulary's text
    marks (line ends, fences) are read now too, so no timed request pays for it."""
    text_marks(target.tokenizer, target.vocab_size)
    curves, measured, ms = {}, [], 0.0
    for name, backend, max_n in [("target", target, MAX_K + 1), *((n, b, MAX_K) for n, b in drafts.items())]:
        told: list[int] = []

        def tell(done: int, total: int, name: str = name, told: list[int] = told) -> None:
            told.append(done)
            if progress is not None:
                progress(name, done, total)

        t0 = time.perf_counter()
        curves[name] = calibrate.load_or_measure(backend, max_n=max_n, progress=tell)
        if told:  # measured, not read from the cache
            measured.append(name)
            ms += 1000 * (time.perf_counter() - t0)
    return Calibration(curves, round(ms, 1), tuple(measured))


def draft_model_verdict(
    target: Backend,
    draft: Backend,
    speculation: SpeculationConfig | None,
    calibration: Calibration | None = None,
) -> str:
    """Why a draft model is not worth its memory here ('' if it may pay, or the policy is not auto).

    From both models' calibrated costs (`calibration`'s "target" and "draft" curves, else
    measured once and cached). The auto policy starts a draft model's estimate at
    DRAFT_MODEL_PRIOR acceptance per token and learns it from the steps that draft with it, and
    from probes where its estimate would not draft (policy.auto.PROBE_*): a draft whose every
    token accepted would not beat plain decoding by MIN_GAIN can never pay, and keeping it
    loaded costs its memory for nothing. The message gives the most it could gain and what it
    would gain at the prior, the figures to compare with a host where it pays.
    """
    if speculation is not None and speculation.policy != "auto":
        return ""
    if calibration is None:
        calibration = calibrate_models(target, {"draft": draft})
    target_cost, draft_cost = calibration.curves["target"], calibration.curves["draft"]
    best, k = draft_speedup(target_cost, draft_cost)
    if best > MIN_GAIN:
        return ""
    at_prior, _ = draft_speedup(target_cost, draft_cost, DRAFT_MODEL_PRIOR)
    return (
        f"not loaded: even with every draft token accepted it would run at {best:.2f}x of plain decoding "
        f"on this machine (best k = {k}, from the calibrated costs; {at_prior:.2f}x at {DRAFT_MODEL_PRIOR:.2f} "
        f"per token), below the {MIN_GAIN:.2f}x the auto policy needs; --policy fixed loads it anyway"
    )


def draft_vocabulary(target: Backend, draft: Backend) -> VocabMap | None:
    """None where the draft model shares the target's tokenizer; else the vocabulary both share,
    which a CrossVocabDrafter drafts in. Raises TokenizerMismatchError (naming both models) where
    they share too little of it (crossvocab.MIN_SHARED)."""
    try:
        check_tokenizers(target, draft)
        return None
    except TokenizerMismatchError:
        pass
    try:
        return shared_vocabulary(target.tokenizer, target.vocab_size, draft.tokenizer, draft.vocab_size)
    except TokenizerMismatchError as exc:
        raise TokenizerMismatchError(
            f"draft model {draft.name!r} cannot draft for target {target.name!r}: {exc}"
        ) from exc


def model_drafter(target: Backend, draft: Backend, vocab: VocabMap | None, options: LoadOptions = LoadOptions()):
    """The drafter "draft" over a draft model: a ModelDrafter where it shares the target's
    tokenizer (vocab None), else a CrossVocabDrafter in their shared vocabulary."""
    if vocab is None:
        return ModelDrafter(draft, name="draft")
    return CrossVocabDrafter(
        draft,
        target.tokenizer,
        target.vocab_size,
        name="draft",
        prompt_mode=options.draft_prompt,
        vocab=vocab,
        draft_level=options.draft_level,
    )


def datastore_drafter(path: str):
    from draftwise.drafters.datastore import DatastoreDrafter

    return DatastoreDrafter(path)


@dataclass(frozen=True)
class Loaded:
    """What load() made: the engine, and its models' calibration (empty when none was made)."""

    engine: Engine
    calibration: Calibration = Calibration()
    draft_note: str = ""  # --draft auto: which draft was paired and why ('' where none was loaded)


def load(
    target: str = models.DEFAULT_TARGET,
    draft: str | None = "ngram",
    *,
    options: LoadOptions = LoadOptions(),
    speculation: SpeculationConfig | None = None,
    progress=None,
    draft_options: LoadOptions | None = None,
    datastore: str | None = None,
    calibrate: bool | None = None,
    calibration_progress: CalibrationProgress | None = None,
    on_target: Callable[[Backend], None] | None = None,
) -> Loaded:
    """Load the target, the drafters and an Engine. Raises ConfigError/ModelError/BackendError.

    The one place that decides which drafters are loaded. Under the auto policy (the default) a
    draft model the policy would never draft with on this machine is closed again after
    calibration (see draft_model_verdict); the engine's `skipped_drafters` says why.

    calibrate: measure (or read the cached) cost curves of the target and the draft model now,
    before any request is timed; None: when the policy is auto. A caller that loads with another
    policy but sends auto requests (the demo, the bench) passes True. on_target is called with
    the target once it is loaded, before any drafter (the bench reads its memory there).
    """
    auto = speculation is None or speculation.policy == "auto"
    drafter_names = parse_drafters(draft)
    target_backend = load_backend(target, options, progress)
    # In the order named: a free drafter, or (None, a draft model's backend) until its verdict.
    entries: list[tuple[Drafter | None, Backend | None]] = []
    vocab: VocabMap | None = None  # the draft model's shared vocabulary, where it has its own
    try:
        if on_target is not None:
            on_target(target_backend)
        paired, first = None, Calibration()
        if pairing.AUTO in drafter_names:  # --draft auto: the best of the user's models, or none
            first = calibrate_models(target_backend, {}, calibration_progress)
            paired = pair_draft(target, target_backend, first.curves["target"], options)
            auto_name = [paired.draft.name] if paired.draft is not None else []
            drafter_names = [m for n in drafter_names for m in (auto_name if n == pairing.AUTO else [n])]
        for name in drafter_names:
            if name in FREE_DRAFTERS:
                entries.append((free_drafter(name, options), None))
                continue
            if any(b is not None for _, b in entries):  # both would be drafter "draft"
                raise ConfigError(f"one draft model at most; {name!r} is a second (use one, with free drafters)")
            # The draft follows the target's slots: a slot's requests draft on its own sequence.
            draft_backend = load_backend(
                name, draft_options or replace(options, n_seq_max=1, slots=num_slots(target_backend)), progress
            )
            entries.append((None, draft_backend))
            vocab = draft_vocabulary(target_backend, draft_backend)  # before any calibration of a useless draft
        model_backends = [b for _, b in entries if b is not None]
        draft_models = {"draft": model_backends[0]} if model_backends else {}
        calibration = Calibration()
        if (auto if calibrate is None else calibrate) or (auto and draft_models):
            calibration = calibrate_models(target_backend, draft_models, calibration_progress)
        drafters, skipped = [], {}
        for i, (drafter, backend) in enumerate(entries):
            if backend is None:
                drafters.append(drafter)
                continue
            reason = draft_model_verdict(target_backend, backend, speculation, calibration) if auto else ""
            if reason:
                entries[i] = (None, None)
                backend.close()
                skipped["draft"] = reason
            else:
                drafters.append(model_drafter(target_backend, backend, vocab, options))
        if datastore:
            drafters.append(datastore_drafter(datastore))
        note = ""
        if paired is not None:
            if paired.draft is None:
                skipped["draft"] = paired.note
            note = paired.note if "draft" not in skipped else ""
            calibration = replace(
                calibration, ms=calibration.ms + first.ms, measured=first.measured + calibration.measured
            )
        engine = Engine(target_backend, drafters, speculation=speculation, skipped_drafters=skipped)
        return Loaded(engine, calibration, note)
    except BaseException:
        target_backend.close()
        for _, backend in entries:
            if backend is not None:
                backend.close()
        raise


def pair_draft(target: str, backend: Backend, target_curve: CostCurve, options: LoadOptions) -> pairing.Pairing:
    """--draft auto's draft for a loaded GGUF target (draftwise.pairing), as load() loads drafts."""
    path = stores.resolve(target, options.models_dirs, fetch=False).path
    if path.is_dir():
        return pairing.Pairing(None, "not loaded: --draft auto pairs GGUF models; name the draft model")
    from draftwise.backends.llamacpp import default_threads

    threads = options.threads or default_threads()  # the draft is loaded with the target's options
    discovery = stores.discover(stores.StoreRoots.from_environment(options.models_dirs))
    slots = num_slots(backend)
    return pairing.pair_draft(
        path, target_curve, threads=threads, n_ctx=options.n_ctx, num_slots=slots, discovery=discovery
    )


def load_engine(target: str = models.DEFAULT_TARGET, draft: str | None = "ngram", **kwargs) -> Engine:
    """load(...)'s engine (the same arguments)."""
    return load(target, draft, **kwargs).engine
