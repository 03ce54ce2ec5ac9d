"""The GGUF models a user already has, found where their tools keep them, read in place.

Stores, each with the names its tool gives its models:
  ollama       ~/.ollama/models, $OLLAMA_MODELS: manifests naming blobs; "qwen2.5-coder:7b"
               (library/ implied), "user/model:tag", "host/namespace/model:tag"
  lmstudio     ~/.lmstudio/models, ~/.cache/lm-studio/models: "publisher/repo/file.gguf"
  huggingface  $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub: "org/repo/file.gguf"
  llama.cpp    $LLAMA_CACHE, ~/.cache/llama.cpp: the file's name
  draftwise    draftwise's own cache (draftwise.models): the registry name
  folder       --models-dir: the path under the folder
Every model also answers to its file's stem where that names one model only. `discover` lists
them with their facts (draftwise.model_facts); `resolve` turns what `--target` was given into
a file. Nothing is copied or written. A store's file is hostile until read: only a regular file
is opened, and a bad one is listed with its problem (or skipped, with the reason) while the
others are listed as usual: nothing one file holds stops a listing.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from draftwise import models
from draftwise.errors import ModelError
from draftwise.gguf_header import MAGIC, SPLIT_PART, GGUFError, not_regular, open_regular, read_header
from draftwise.model_facts import ModelFacts, check_memory, facts_of

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_DIGEST = re.compile(r"sha256:([0-9a-fA-F]{64})")  # a layer's digest; its blob is blobs/sha256-<hex>
MAX_MANIFEST_BYTES = 2**20  # Ollama's are ~1 KB


@dataclass(frozen=True)
class FoundModel:
    """A model in a store: what --target takes (name), where it lies, and what it is. A model
    that cannot be used (a missing blob, a truncated file) has no facts and a problem instead."""

    name: str
    store: str
    path: Path
    facts: ModelFacts | None = None
    problem: str | None = None
    parts: tuple[Path, ...] = ()  # a split model's parts, the first one (path) included

    def as_json(self) -> dict:
        out = {"name": self.name, "store": self.store, "path": str(self.path)}
        if self.facts is not None:
            out.update(self.facts.as_json())
        if self.problem is not None:
            out["problem"] = self.problem
        return out


@dataclass(frozen=True)
class Skipped:
    """A file a store holds that is no model to run: a projector, a split model's later part."""

    path: Path
    reason: str


@dataclass(frozen=True)
class Discovery:
    models: tuple[FoundModel, ...]
    skipped: tuple[Skipped, ...] = ()
    searched: tuple[tuple[str, Path], ...] = ()  # (store, folder) looked in


@dataclass(frozen=True)
class StoreRoots:
    """The folders each store is looked for in, from the environment and the home folder."""

    roots: tuple[tuple[str, Path], ...] = field(default_factory=tuple)

    @classmethod
    def from_environment(
        cls, extra_dirs: Sequence[str | Path] = (), env: Mapping[str, str] | None = None
    ) -> StoreRoots:
        env = os.environ if env is None else env
        home = Path(env.get("HOME") or Path.home())
        cache = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
        hf_home = Path(env["HF_HOME"]) if env.get("HF_HOME") else cache / "huggingface"
        roots = [
            ("draftwise", cache / "draftwise" / "models"),
            ("ollama", Path(env["OLLAMA_MODELS"]) if env.get("OLLAMA_MODELS") else home / ".ollama" / "models"),
            ("ollama", Path("/usr/share/ollama/.ollama/models")),  # the Linux service's store
            ("lmstudio", home / ".lmstudio" / "models"),
            ("lmstudio", cache / "lm-studio" / "models"),
            ("huggingface", Path(env["HF_HUB_CACHE"]) if env.get("HF_HUB_CACHE") else hf_home / "hub"),
            ("llama.cpp", Path(env["LLAMA_CACHE"]) if env.get("LLAMA_CACHE") else cache / "llama.cpp"),
        ]
        roots += [("folder", Path(d).expanduser()) for d in extra_dirs]
        seen, unique = set(), []
        for store, root in roots:
            if (store, root) not in seen:
                seen.add((store, root))
                unique.append((store, root))
        return cls(tuple(unique))


# ---------------------------------------------------------------------- finding files
def _ollama(root: Path) -> Iterator[tuple[str, Path, str | None]]:
    """(name, blob, problem) for each manifest in an Ollama store whose model layer is a blob."""
    manifests = root / "manifests"
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        parts = manifest.relative_to(manifests).parts
        if len(parts) != 4:  # host/namespace/model/tag
            continue
        host, namespace, model, tag = parts
        if host == OLLAMA_REGISTRY:
            name = f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
        else:
            name = f"{host}/{namespace}/{model}:{tag}"
        digest, problem = _model_layer(manifest)
        if problem is not None:
            yield name, manifest, problem
            continue
        blob = root / "blobs" / f"sha256-{digest}"
        if not blob.is_file():
            missing = f"missing from {root / 'blobs'} (or not a regular file)"
            yield name, blob, f"manifest {manifest} names blob {blob.name}, which is {missing}"
        else:
            yield name, blob, None


def _model_layer(manifest: Path) -> tuple[str | None, str | None]:
    """The hex digest of a manifest's model layer, or the problem that it names none. The digest
    must be sha256 and 64 hex digits, so the blob path it makes never leaves blobs/ (a digest
    "/etc/passwd" or "sha256:../../x" names no blob)."""
    try:
        if manifest.stat().st_size > MAX_MANIFEST_BYTES:
            return None, f"manifest {manifest} is over {MAX_MANIFEST_BYTES >> 20} MiB, not an Ollama manifest"
        with open_regular(manifest) as f:
            layers = json.loads(f.read(MAX_MANIFEST_BYTES + 1).decode("utf-8")).get("layers", [])
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
    except (OSError, GGUFError, ValueError, AttributeError, KeyError, TypeError, StopIteration, RecursionError):
        return None, f"manifest {manifest} names no model layer ({OLLAMA_MODEL_LAYER})"
    match = OLLAMA_DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if match is None:
        return None, f"manifest {manifest} names model layer {str(digest)[:80]!r}, not a sha256 digest"
    return match.group(1).lower(), None


def _hub(root: Path) -> Iterator[tuple[str, Path]]:
    """("org/repo/file.gguf", path) for each GGUF in a Hugging Face hub cache's snapshots, the
    newest snapshot's where several hold one file."""
    for repo in sorted(root.glob("models--*")):
        org_repo = repo.name[len("models--") :].replace("--", "/")
        snapshots = sorted((p for p in (repo / "snapshots").glob("*") if p.is_dir()), key=_mtime, reverse=True)
        seen: set[str] = set()
        for snapshot in snapshots:
            for path in sorted(snapshot.rglob("*.gguf")):
                rel = path.relative_to(snapshot).as_posix()
                if rel not in seen:
                    seen.add(rel)
                    yield f"{org_repo}/{rel}", path


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _files(store: str, root: Path) -> Iterator[tuple[str, Path, str | None]]:
    """(name, path, problem) for each model file a store's folder holds."""
    if store == "ollama":
        yield from _ollama(root)
    elif store == "huggingface" or (store == "llama.cpp" and any(root.glob("models--*"))):
        for name, path in _hub(root):
            yield name, path, None
    elif store == "draftwise":
        for path in sorted(root.glob("*.gguf")):
            yield path.stem, path, None
    else:
        for path in sorted(root.rglob("*.gguf")):
            yield path.relative_to(root).as_posix(), path, None


# ---------------------------------------------------------------------- reading them
def _later_part(path: Path) -> bool:
    """A split model's second or later part (model-00002-of-00003.gguf); a part beyond the count
    it gives (00003-of-00002) is not one: it is listed, with its problem."""
    match = SPLIT_PART.search(path.name)
    return match is not None and 1 < int(match.group(1)) <= int(match.group(2))


def _is_projector(path: Path, meta: Mapping) -> bool:
    return path.name.lower().startswith("mmproj") or meta.get("general.type") == "mmproj"


def _split_parts(path: Path) -> tuple[tuple[Path, ...], str | None]:
    """A split model's parts from its first part's name (model-00001-of-00003.gguf), and a
    problem when one is missing."""
    match = SPLIT_PART.search(path.name)
    if match is None:
        return (path,), None
    index, total = int(match.group(1)), int(match.group(2))
    if not 1 <= index <= total:
        return (path,), f"split model: its name says part {index} of {total}"
    stem = path.name[: match.start()]
    names = [f"{stem}-{i:05d}-of-{total:05d}.gguf" for i in range(1, total + 1)]
    try:  # one listing of the folder, not a look-up for each of up to 99,999 parts
        present = set(os.listdir(path.parent))
    except OSError:
        present = set()
    missing = [n for n in names if n not in present or not (path.parent / n).is_file()]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3:,} more" if len(missing) > 3 else "")
        return (path,), f"split model: part {shown} missing (or not a regular file)"
    return tuple(path.with_name(n) for n in names), None


def inspect(name: str, store: str, path: Path, problem: str | None = None) -> FoundModel | Skipped | None:
    """One file of a store: a model (with its facts, or a problem), a Skipped, or None for a
    split model's later part (listed through its first). Never raises for what the file holds."""
    if problem is not None:
        return FoundModel(name, store, path, problem=problem)
    try:
        kind = not_regular(path)
    except OSError as exc:
        return FoundModel(name, store, path, problem=f"{path}: cannot be read ({exc.strerror or exc})")
    if kind is not None:
        return Skipped(path, f"{kind}, not a model file")
    if _later_part(path):
        return None
    try:
        return _read_model(name, store, path)
    except GGUFError as exc:
        return FoundModel(name, store, path, problem=str(exc))
    except OSError as exc:
        return FoundModel(name, store, path, problem=f"{path}: cannot be read ({exc.strerror or exc})")
    except (ArithmeticError, ValueError, TypeError, LookupError, RecursionError) as exc:
        # NOTE: a header no check above foresaw; listed as unusable rather than stopping the
        # listing (tests/unit/test_gguf_fuzz.py fails on this message: it is a bug to fix).
        return FoundModel(name, store, path, problem=f"{path}: {UNFORESEEN} ({type(exc).__name__}: {exc})")


UNFORESEEN = "cannot be used (a header this version does not read)"


def _read_model(name: str, store: str, path: Path) -> FoundModel | Skipped:
    with open_regular(path) as f:
        if f.read(4) != MAGIC:
            return Skipped(path, "not a GGUF file")
    parts, missing = _split_parts(path)
    if missing:
        return FoundModel(name, store, path, problem=f"{path}: {missing}", parts=parts)
    headers = [read_header(p) for p in parts]
    if _is_projector(path, headers[0].metadata):
        return Skipped(path, "a multimodal projector (mmproj), loaded beside a model, not alone")
    return FoundModel(name, store, path, facts_of(headers), parts=parts)


def discover(roots: StoreRoots | None = None, *, with_facts: bool = True) -> Discovery:
    """Every model in every store folder that exists. with_facts=False lists names and paths
    only (no header is read): what resolving a name needs."""
    roots = roots or StoreRoots.from_environment()
    found: list[FoundModel] = []
    skipped: list[Skipped] = []
    searched = []
    for store, root in roots.roots:
        try:
            if not root.is_dir():
                continue
        except OSError:  # a folder we may not look into
            continue
        searched.append((store, root))
        for name, path, problem in _files(store, root):
            if not with_facts:
                if not _later_part(path) and _regular(path):
                    found.append(FoundModel(name, store, path, problem=problem))
                continue
            item = inspect(name, store, path, problem)
            if isinstance(item, FoundModel):
                found.append(item)
            elif isinstance(item, Skipped):
                skipped.append(item)
    return Discovery(tuple(found), tuple(skipped), tuple(searched))


def _regular(path: Path) -> bool:
    try:
        return not_regular(path) is None
    except OSError:  # a dangling link: listed, and its problem said when it is used
        return True


# ---------------------------------------------------------------------- names
def aliases(model: FoundModel) -> tuple[str, ...]:
    """What else a model answers to: its file's stem, and for Ollama's ":latest" its bare name."""
    out = []
    if model.store == "ollama" and model.name.endswith(":latest"):
        out.append(model.name[: -len(":latest")])
    if model.store != "ollama":
        stem = Path(model.name).name
        out.append(stem[: -len(".gguf")] if stem.endswith(".gguf") else stem)
    return tuple(out)


@dataclass(frozen=True)
class Resolved:
    path: Path
    name: str  # the model's name as the user gave it (the server's model id)
    store: str | None = None  # None: a registry name or a path


def find(spec: str, discovery: Discovery) -> FoundModel | None:
    """The model spec names: a store's name first, then an alias naming one model only.
    Raises ModelError when an alias names several."""
    exact = [m for m in discovery.models if m.name == spec]
    if exact:
        return exact[0]  # the first store (in StoreRoots' order) that has it
    by_alias = [m for m in discovery.models if spec in aliases(m)]
    if len({m.path for m in by_alias}) > 1:
        names = ", ".join(f"{m.name} ({m.store})" for m in by_alias)
        raise ModelError(f"model {spec!r} names several models: {names}; give one of these names")
    return by_alias[0] if by_alias else None


def closest_names(spec: str, discovery: Discovery, n: int = 5) -> list[str]:
    names = list(models.REGISTRY) + [m.name for m in discovery.models]
    names += [a for m in discovery.models for a in aliases(m)]
    close = difflib.get_close_matches(spec, names, n=n, cutoff=0.4)
    if len(close) < n:  # a part of a name: "coder" finds "qwen2.5-coder:7b"
        close += [name for name in names if spec.lower() in name.lower() and name not in close][: n - len(close)]
    return close


def resolve(spec: str, extra_dirs: Sequence[str | Path] = (), *, fetch: bool = True, progress=None) -> Resolved:
    """What --target (or a draft model's name) was given, as a file: a registry name (fetched
    when needed), a path, or a model in a store. Raises ModelError naming the closest names
    when it is none of them, and naming the file when the model cannot be used."""
    if spec in models.REGISTRY:
        return Resolved(models.resolve(spec, fetch=fetch, progress=progress), spec)
    path = Path(spec).expanduser()
    if path.exists():
        return Resolved(path, path.name)
    discovery = discover(StoreRoots.from_environment(extra_dirs), with_facts=False)
    model = find(spec, discovery)
    if model is None:
        close = closest_names(spec, discovery)
        hint = f"; the closest: {', '.join(close)}" if close else ""
        raise ModelError(
            f"model {spec!r} is neither a known name nor an existing file or directory{hint} "
            "(`draftwise models` lists the models found)"
        )
    if model.problem is not None:
        raise ModelError(f"model {spec!r} ({model.store}) cannot be used: {model.problem}")
    return Resolved(model.path, model.name, model.store)


def check_loadable(path: Path, n_ctx: int, num_slots: int = 1) -> None:
    """Before llama.cpp maps a GGUF file: its header (every part's) must read whole, and the
    model with its KV cache must fit in the memory left. Raises ModelError naming the file."""
    parts, missing = _split_parts(path)
    if missing:
        raise ModelError(f"{path}: {missing}")
    try:
        headers = [read_header(p, with_tokens=False) for p in parts]
    except OSError as exc:
        raise ModelError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    check_memory(path, facts_of(headers), n_ctx, num_slots)
