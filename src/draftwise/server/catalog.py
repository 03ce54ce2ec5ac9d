"""Which models a server of several serves (`serve --models all|NAME,...|DIR`): the ModelSources
of pool.py, each named as its store names it (Ollama's `qwen2.5-coder:7b`, a registry name, a
file's name), with the memory it will hold and Ollama's details read from its GGUF header, and a
loader that builds its engine as `serve` builds one. Nothing is loaded here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from draftwise import models, stores
from draftwise.engine import Engine
from draftwise.errors import ConfigError, ModelError
from draftwise.gguf_header import read_header
from draftwise.model_facts import ModelFacts, facts_of, memory_needed
from draftwise.server.pool import ModelSource


@dataclass(frozen=True)
class Served:
    """A model to serve: the name clients send and its file."""

    name: str
    path: Path
    facts: ModelFacts | None = None
    problem: str | None = None  # why it cannot load (a truncated file, a missing blob): its requests fail with it


def _facts(path: Path) -> ModelFacts | None:
    try:
        return facts_of([read_header(path, with_tokens=False)])
    except (ModelError, OSError):
        return None  # a file that cannot be read fails its own requests when loaded, by name


def chosen(spec: str, default: str, extra_dirs: Sequence[str | Path] = ()) -> list[Served]:
    """The models `--models spec` names, the default (`--target`) first; duplicates (the same
    file) once. spec: "all" (every model the stores hold), a folder (its GGUF files), or names
    (comma-separated, as `--target` takes them). Raises ModelError for a name that is no model."""
    out: list[Served] = []
    seen: set[Path] = set()

    def add(name: str, path: Path, facts: ModelFacts | None = None, problem: str | None = None) -> None:
        key = path.resolve() if path.exists() else path
        if key in seen:
            return
        seen.add(key)
        if any(s.name == name for s in out):
            raise ConfigError(f"two models would be served as {name!r}: {path} and another; serve one of them")
        out.append(Served(name, path, facts, problem))

    whole_store = spec == "all" or Path(spec).is_dir()
    for name in [default, *(() if whole_store else spec.split(","))]:
        name = name.strip()
        if not name:
            continue
        if name in models.REGISTRY:  # fetched when first asked for, if it is not yet
            add(name, models.model_path(name), _facts(models.model_path(name)))
            continue
        resolved = stores.resolve(name, extra_dirs, fetch=False)
        add(resolved.name, resolved.path, _facts(resolved.path))
    if whole_store:
        roots = (
            stores.StoreRoots.from_environment(extra_dirs)
            if spec == "all"
            else stores.StoreRoots((("folder", Path(spec)),))
        )
        for found in stores.discover(roots).models:
            add(found.name, found.path, found.facts, found.problem)
    return out


def _details(served: Served, n_ctx: int) -> dict:
    """Ollama's details of a model, and what /api/show tells before it is loaded: the window it
    will be served with (n_ctx, at most its trained one)."""
    facts = served.facts
    if facts is None:
        return {"format": "gguf"}
    capabilities = ["completion"] + (["tools"] if facts.tool_format else []) + (["insert"] if facts.fim else [])
    return {
        "format": "gguf",
        "family": facts.architecture,
        "parameter_size": facts.size_label or f"{facts.num_params / 1e9:.1f}B",
        "quantization_level": facts.quantisation,
        "context_length": min(n_ctx, facts.context_length or n_ctx),
        "capabilities": capabilities,
    }


def sources(
    served: Sequence[Served], load: Callable[[str], Engine], *, n_ctx: int, num_slots: int
) -> list[ModelSource]:
    """ModelSources of the chosen models; load(spec) builds one's engine (a registry name, else
    the file's path)."""
    out = []
    for s in served:
        spec = s.name if s.name in models.REGISTRY else str(s.path)
        if s.facts is not None:
            size, memory = s.facts.size_bytes, memory_needed(s.facts, n_ctx, num_slots)
        elif s.name in models.REGISTRY:  # not pulled yet: its file's size
            size = memory = models.REGISTRY[s.name].size
        else:
            size = memory = 0
        out.append(
            ModelSource(
                name=s.name,
                load=(lambda spec=spec: load(spec)) if s.problem is None else _refuse(s.problem),
                memory_bytes=memory,
                size_bytes=size,
                details=_details(s, n_ctx),
            )
        )
    return out


def _refuse(problem: str) -> Callable[[], Engine]:
    def load() -> Engine:
        raise ModelError(problem)

    return load
