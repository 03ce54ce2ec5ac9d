"""Which models a server of several serves (`serve --models all|NAME,...|DIR`): the ModelSources
of pool.py, each named as its store names it (Ollama's `qwen2.5-coder:7b`, a registry name, a
file's name), with the memory it will hold and Ollama's details read from its GGUF header, and a
loader that builds its engine as `serve` builds one. Nothing is loaded here.

A model two stores hold (the same file, a hard link, or the same SHA-256: an Ollama blob that is
also in draftwise's cache) is served once, under the first store's name, and answers to the
others' names too.
"""

from __future__ import annotations

import dataclasses
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from draftwise import models, stores
from draftwise.engine import Engine
from draftwise.errors import ConfigError, ModelError
from draftwise.model_facts import ModelFacts, memory_needed
from draftwise.server.pool import ModelSource


@dataclass(frozen=True)
class Served:
    """A model to serve: the name clients send and its file."""

    name: str
    path: Path
    facts: ModelFacts | None = None
    problem: str | None = None  # why it cannot load (a truncated file, a missing blob): its requests fail with it
    aliases: tuple[str, ...] = ()  # the names other stores (or this one) also give it


def _facts(name: str, path: Path) -> tuple[ModelFacts | None, str | None]:
    """A named model's facts, or why it cannot be used: read as a store's file is (stores.inspect),
    so a hostile file is a model whose requests fail with its problem, never a server that does
    not start."""
    if not path.is_file():  # a registry name not pulled yet (fetched when first asked for), a folder
        return None, None  # (a Hugging Face model's): the loader reads it
    found = stores.inspect(name, "", path)
    if isinstance(found, stores.FoundModel):
        return found.facts, found.problem
    return None, None  # no GGUF model (a projector, another format): the loader says why


def chosen(spec: str, default: str, extra_dirs: Sequence[str | Path] = ()) -> list[Served]:
    """The models `--models spec` names, the default (`--target`) first; duplicates (the same
    file) once. spec: "all" (every model the stores hold), a folder (its GGUF files), or names
    (comma-separated, as `--target` takes them). Raises ModelError for a name that is no model."""
    out: list[Served] = []
    known: list[set[tuple]] = []  # each served model's identities (_identities)

    def add(
        name: str,
        path: Path,
        facts: ModelFacts | None = None,
        problem: str | None = None,
        aliases=(),
        found_in_store: bool = False,
    ) -> None:
        ids = _identities(name, path)
        for i, served in enumerate(out):
            if ids & known[i]:  # the same model in another store: one more name for it
                more = [n for n in (name, *aliases) if n != served.name and n not in served.aliases]
                out[i] = dataclasses.replace(served, aliases=(*served.aliases, *more))
                known[i] |= ids
                return
        if any(s.name == name for s in out):
            if not found_in_store:
                raise ConfigError(f"two models would be served as {name!r}: {path} and another; serve one of them")
            name = str(path)  # two stores' files of one name (two folders' model.gguf): its path, not a refusal
        out.append(Served(name, path, facts, problem, tuple(aliases)))
        known.append(ids)

    whole_store = spec == "all" or Path(spec).is_dir()
    for name in [default, *(() if whole_store else spec.split(","))]:
        name = name.strip()
        if not name:
            continue
        if name in models.REGISTRY:  # fetched when first asked for, if it is not yet
            add(name, models.model_path(name), *_facts(name, models.model_path(name)))
            continue
        resolved = stores.resolve(name, extra_dirs, fetch=False)
        add(resolved.name, resolved.path, *_facts(resolved.name, resolved.path))
    if whole_store:
        roots = (
            stores.StoreRoots.from_environment(extra_dirs)
            if spec == "all"
            else stores.StoreRoots((("folder", Path(spec)),))
        )
        for found in stores.discover(roots).models:
            add(found.name, found.path, found.facts, found.problem, stores.aliases(found), found_in_store=True)
    return out


def other_names(name: str, path: Path, extra_dirs: Sequence[str | Path] = ()) -> tuple[str, ...]:
    """What else the stores call the model file at `path`, served alone as `name` (`serve
    --target`): the names of the same file in every store, and their aliases. Only names and paths
    are listed, no header read. Example: a registry model whose file is also an Ollama blob ->
    ("smollm2:135m",)."""
    ids = _identities(name, path)
    found = stores.discover(stores.StoreRoots.from_environment(extra_dirs), with_facts=False).models
    pending = [(m, _identities(m.name, m.path)) for m in found if m.problem is None]
    out: list[str] = []
    grew = True
    while grew:  # the same file by its path in one store, by its SHA-256 in another
        grew = False
        for model, model_ids in list(pending):
            if model_ids & ids:
                ids |= model_ids
                out += [model.name, *stores.aliases(model)]
                pending.remove((model, model_ids))
                grew = True
    return tuple(n for n in dict.fromkeys(out) if n != name)


_OLLAMA_BLOB = re.compile(r"sha256[-:]([0-9a-f]{64})")


def _identities(name: str, path: Path) -> set[tuple]:
    """What tells a model file from another without reading it: its resolved path, its inode, and
    its SHA-256 where a name says it (an Ollama blob's file name, a registry model's)."""
    ids: set[tuple] = {("path", str(path))}
    try:
        ids.add(("path", str(path.resolve())))
        info = path.stat()
        ids.add(("inode", info.st_dev, info.st_ino))
    except (OSError, RuntimeError):  # missing, or a symlink loop: its path alone
        pass
    blob = _OLLAMA_BLOB.fullmatch(path.name)
    if blob is not None:
        ids.add(("sha256", blob.group(1)))
    if name in models.REGISTRY:
        ids.add(("sha256", models.REGISTRY[name].sha256))
    return ids


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
        if s.problem is not None:
            check = _refuse(s.problem)
        elif s.name in models.REGISTRY:
            check = None  # fetched when first asked for, if it is not yet
        else:
            check = _present(s.path)
        out.append(
            ModelSource(
                name=s.name,
                load=(lambda spec=spec: load(spec)) if s.problem is None else _refuse(s.problem),
                memory_bytes=max(0, memory),
                size_bytes=max(0, size),
                details=_details(s, n_ctx),
                aliases=s.aliases,
                check=check,
            )
        )
    return out


def _refuse(problem: str) -> Callable[[], Engine]:
    def load() -> Engine:
        raise ModelError(problem)

    return load


def _present(path: Path) -> Callable[[], None]:
    """A check that the model's file is still there, a regular file (deleted, or replaced by a
    folder or a pipe since the server started: its load cannot start)."""

    def check() -> None:
        try:
            info = path.stat()
        except OSError as exc:
            raise ModelError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
        if not stat.S_ISREG(info.st_mode):
            raise ModelError(f"{path} is not a regular file")

    return check
