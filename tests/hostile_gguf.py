"""GGUF bytes written by hand for tests of hostile files: any value type at any key, counts and
lengths that lie, and a tiny real model's header re-written with one key changed.

`parse(path)` splits a GGUF file into its key-values (key, type, encoded value), its tensor
infos and its data; `build(...)` joins them again (the data re-aligned), so a test can put a
float NaN where llama.cpp wants an integer and still keep the model's tensors. Nothing is
committed: every hostile file is made inside its test.
"""

from __future__ import annotations

import contextlib
import signal
import struct
from dataclasses import dataclass, replace
from pathlib import Path

# value type -> struct format (8 string, 9 array)
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
ALIGN = 32


def string(text: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string: its length (as given, or the true one) then its bytes."""
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def value(kind: int, v) -> bytes:
    """A value of type kind: a scalar, a string, or for an array (item_type, items)."""
    if kind in SCALARS:
        return struct.pack(SCALARS[kind], v)
    if kind == STRING:
        return string(v)
    item, items = v
    return struct.pack("<IQ", item, len(items)) + b"".join(value(item, x) for x in items)


def kv(key: str, kind: int, v) -> tuple[str, int, bytes]:
    return key, kind, value(kind, v)


@dataclass(frozen=True)
class RawGGUF:
    version: int
    kvs: tuple[tuple[str, int, bytes], ...]  # (key, type, encoded value)
    tensor_infos: bytes
    num_tensors: int
    data: bytes

    def with_kv(self, key: str, kind: int, v) -> RawGGUF:
        """The same file with key's value replaced (or added) by one of type kind."""
        kvs = [item for item in self.kvs if item[0] != key] + [kv(key, kind, v)]
        return replace(self, kvs=tuple(kvs))

    def without(self, key: str) -> RawGGUF:
        return replace(self, kvs=tuple(item for item in self.kvs if item[0] != key))


def build(raw: RawGGUF, *, num_tensors: int | None = None, num_kv: int | None = None, pad: bool = True) -> bytes:
    """The file's bytes; num_tensors / num_kv override the counts written (to make them lie);
    pad=False ends the file where the header does (as a vocabulary-only file may)."""
    head = b"GGUF" + struct.pack("<IQQ", raw.version, raw.num_tensors if num_tensors is None else num_tensors,
                                 len(raw.kvs) if num_kv is None else num_kv)  # fmt: skip
    body = head + b"".join(string(key) + struct.pack("<I", kind) + v for key, kind, v in raw.kvs) + raw.tensor_infos
    return body + b"\0" * (-len(body) % ALIGN if pad else 0) + raw.data


def write(path: Path, raw: RawGGUF, **counts) -> Path:
    path.write_bytes(build(raw, **counts))
    return path


def _skip(buf: bytes, pos: int, kind: int) -> int:
    if kind in SCALARS:
        return pos + struct.calcsize(SCALARS[kind])
    if kind == STRING:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    item, n = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    for _ in range(n):
        pos = _skip(buf, pos, item)
    return pos


def parse(path: Path) -> RawGGUF:
    """A well-formed GGUF file (alignment 32) split into its parts."""
    buf = Path(path).read_bytes()
    version, num_tensors, num_kv = struct.unpack_from("<IQQ", buf, 4)
    pos, kvs = 24, []
    for _ in range(num_kv):
        (n,) = struct.unpack_from("<Q", buf, pos)
        key = buf[pos + 8 : pos + 8 + n].decode()
        (kind,) = struct.unpack_from("<I", buf, pos + 8 + n)
        start = pos + 12 + n
        pos = _skip(buf, start, kind)
        kvs.append((key, kind, buf[start:pos]))
    start = pos
    for _ in range(num_tensors):
        (n,) = struct.unpack_from("<Q", buf, pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos + 8 + n)
        pos += 8 + n + 4 + 8 * n_dims + 4 + 8
    data_start = pos + (-pos % ALIGN)
    return RawGGUF(version, tuple(kvs), buf[start:pos], num_tensors, buf[data_start:])


class Hung(Exception):
    """A block still running at its time limit (not an OSError: no `except OSError` swallows it)."""


@contextlib.contextmanager
def within(seconds: float):
    """Fails the block with Hung after seconds (SIGALRM: a blocked open() is interrupted too)."""

    def expire(signum, frame):
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
