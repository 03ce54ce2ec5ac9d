"""A GGUF file's header read without loading its weights: metadata, tensor shapes, and the facts
a model list shows (family, parameters, quantisation, vocabulary, context, chat template, FIM).

The format (github.com/ggml-org/ggml docs/gguf.md, versions 2 and 3): "GGUF", a version, the
tensor and key-value counts, the key-values, then one (name, shape, type, offset) per tensor;
the data follows, aligned. Every length is checked against the file's size, so a truncated or
corrupt file is a GGUFError naming it, never a crash or a huge allocation; and what a header may
make the reader do is bounded (Limits): keys, tensors and strings read past, and the text kept.
Only a regular file is opened (a FIFO would block the reader for ever, a device never ends).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from draftwise.errors import ModelError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# ggml tensor types -> (elements per block, bytes per block) (ggml's GGML_QUANT_SIZES).
QUANT_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 36),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    16: (256, 66),  # IQ2_XXS
    17: (256, 74),  # IQ2_XS
    18: (256, 98),  # IQ3_XXS
    19: (256, 50),  # IQ1_S
    20: (32, 18),  # IQ4_NL
    21: (256, 110),  # IQ3_S
    22: (256, 82),  # IQ2_S
    23: (256, 136),  # IQ4_XS
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    29: (256, 56),  # IQ1_M
    30: (1, 2),  # BF16
    34: (256, 54),  # TQ1_0
    35: (256, 66),  # TQ2_0
    39: (32, 17),  # MXFP4
}
# general.file_type (llama.cpp's llama_ftype) -> the name quantisers and model cards use.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}  # fmt: skip
# ggml tensor types by name, for a file without general.file_type (the most common matrix type).
TENSOR_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K", 14: "Q6_K",
                30: "BF16"}  # fmt: skip
# Value types: fixed-size scalars by struct format; 8 is a string, 9 an array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
# Arrays kept as values: the token list (texts), and small ones (the rest are skipped over).
TOKENS_KEY = "tokenizer.ggml.tokens"
_KEPT_ARRAYS = (TOKENS_KEY,)
_SMALL_ARRAY = 64
# What a header may make the reader do. Real headers stay far inside: ~30-60 keys, a few thousand
# tensors, vocabularies up to 262,144 tokens (Gemma 3), merges up to ~450k, chat templates of tens
# of KB. NOTE: a longer value string (some converters stored the whole tokenizer.json, MBs) is
# read past, not refused: its file is still a model llama.cpp loads.
MAX_KEY_BYTES = 65_535  # the format's own limit on a key's (and a tensor name's) length
MAX_KEYS = 2**16
MAX_TENSORS = 2**18
MAX_TOKENS = 2**20  # 4x the largest vocabulary shipped
MAX_STRINGS_READ = 2**23  # string-array items walked over (each length must be read), the header's whole
MAX_KEPT_STRING = 2**20  # a value string kept as text; a longer one is read past (SkippedString)
MAX_KEPT_BYTES = 128 * 2**20  # the memory the kept keys, strings, arrays and tensor infos may take
_STRING_COST, _ITEM_COST, _TENSOR_COST = 56, 32, 256  # Python's bytes per str / int / TensorInfo beside the text
# A split model's later parts ("-00002-of-00003.gguf"): loaded through the first part.
SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


class GGUFError(ModelError):
    """Not a GGUF file, or a truncated or corrupt one; the message names the file."""


class NotRegularFile(GGUFError):
    """A directory, FIFO, device or socket where a model file was looked for: never opened."""


def not_regular(path: Path) -> str | None:
    """What path is when it is no regular file ("a named pipe (FIFO)"), None when it is one (a
    link to one included). Raises OSError when it cannot be looked at (a dangling link)."""
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def open_regular(path: Path):
    """path opened for reading in binary, only if it is a regular file (checked before opening,
    and again on the open file: it may have been swapped); else NotRegularFile."""
    kind = not_regular(path)
    if kind is None:  # O_NONBLOCK: a FIFO put in its place since never blocks the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return os.fdopen(fd, "rb")
        os.close(fd)
        kind = "not a regular file"
    raise NotRegularFile(f"{path}: {kind}, not a model file")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section

    @property
    def num_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def num_bytes(self) -> int | None:
        """Bytes of the tensor's data, None for a type this reader does not know."""
        block = QUANT_SIZES.get(self.ggml_type)
        return None if block is None else self.num_elements // block[0] * block[1]


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, object]
    tensors: tuple[TensorInfo, ...]
    data_offset: int  # where the tensor data starts
    file_size: int
    # A digest of the token list as the file stores it (equal lists, equal ids: what "the same
    # vocabulary" means); read with or without the texts. None without a list of strings.
    vocabulary_id: str | None = None


class _Reader:
    """Little-endian reads from a buffer, each checked against its end, and what the header makes
    it keep (kept: the memory its values take) and walk over (strings_read) against Limits."""

    def __init__(self, buf, path: Path, kept: tuple[str, ...]) -> None:
        self.buf, self.pos, self.path, self.end, self.kept = buf, 0, path, len(buf), kept
        self.kept_bytes = self.strings_read = 0
        self.vocabulary_id: str | None = None

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise GGUFError(
                f"{self.path}: truncated or corrupt GGUF file (the header runs past its end at byte {self.pos})"
            )

    def keep(self, n: int) -> None:
        self.kept_bytes += n
        if self.kept_bytes > MAX_KEPT_BYTES:
            raise GGUFError(f"{self.path}: corrupt GGUF file (its header holds over {MAX_KEPT_BYTES >> 20} MiB)")

    def scalar(self, fmt: str):
        size = struct.calcsize(fmt)
        self.need(size)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def name(self, what: str) -> str:
        """A key or a tensor's name: at most MAX_KEY_BYTES, refused unread beyond."""
        n = self.scalar("<Q")
        if n > MAX_KEY_BYTES:
            raise GGUFError(f"{self.path}: corrupt GGUF file (a {what} of {n:,} bytes at byte {self.pos - 8})")
        return self.string_of(n)

    def string_of(self, n: int) -> str:
        self.need(n)
        self.keep(n + _STRING_COST)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def string(self) -> str | SkippedString:
        n = self.scalar("<Q")
        if n <= MAX_KEPT_STRING:
            return self.string_of(n)
        self.need(n)  # read past, not read
        self.pos += n
        return SkippedString(n)

    def strings(self, n: int, keep: bool) -> list[str] | SkippedArray:
        """n strings, or past them (every length must be read to find the next key). One loop
        of local names: a 150k-token vocabulary's texts and merges take ~0.1 s, not ~0.8 s."""
        self.need(8 * n)  # each at least its length: a count the file cannot hold is refused unread
        self.strings_read += n
        if self.strings_read > MAX_STRINGS_READ:
            raise GGUFError(f"{self.path}: corrupt GGUF file (over {MAX_STRINGS_READ:,} strings in its arrays)")
        buf, pos, end, length_at = self.buf, self.pos, self.end, _U64.unpack_from
        out: list[str] = []
        if keep:
            self.keep(n * _STRING_COST)
        budget = MAX_KEPT_BYTES - self.kept_bytes
        for _ in range(n):
            if pos + 8 > end:
                self.pos = pos
                self.need(8)  # raises: the array runs past the file's end
            (length,) = length_at(buf, pos)
            pos += 8 + length
            if keep and pos <= end:
                budget -= length
                if budget < 0:
                    self.keep(MAX_KEPT_BYTES)  # raises: more text than a header may hold
                out.append(buf[pos - length : pos].decode("utf-8", errors="replace"))
        self.need(pos - self.pos)  # past the end: truncated
        if keep:
            self.kept_bytes = MAX_KEPT_BYTES - budget
        self.pos = pos
        return out if keep else SkippedArray(n, _STRING)

    def value(self, kind: int, key: str):
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise GGUFError(f"{self.path}: corrupt GGUF file (value type {kind} of {key!r})")
        item, n = self.scalar("<I"), self.scalar("<Q")
        if key in self.kept and item != _STRING:
            raise GGUFError(f"{self.path}: corrupt GGUF file ({key} is an array of type {item}, not of strings)")
        if key in self.kept and n > MAX_TOKENS:
            raise GGUFError(f"{self.path}: {key} holds {n:,} tokens, more than the {MAX_TOKENS:,} read")
        keep = key in self.kept or n <= _SMALL_ARRAY
        if item in _SCALARS:
            size = struct.calcsize(_SCALARS[item])
            self.need(n * size)
            if not keep:
                self.pos += n * size
                return SkippedArray(n, item)
            self.keep(n * _ITEM_COST)
            out = [v for (v,) in struct.iter_unpack(_SCALARS[item], self.buf[self.pos : self.pos + n * size])]
            self.pos += n * size
            return out
        if item == _STRING:
            start = self.pos
            out = self.strings(n, keep)
            if key == TOKENS_KEY and n:  # the lengths and texts as stored: ~5 ms for 262,144 tokens
                digest = hashlib.blake2b(struct.pack("<Q", n), digest_size=16)
                digest.update(self.buf[start : self.pos])
                self.vocabulary_id = digest.hexdigest()
            return out
        raise GGUFError(f"{self.path}: corrupt GGUF file (array of type {item} in {key!r})")

    def tensor(self) -> TensorInfo:
        name = self.name("tensor name")
        n_dims = self.scalar("<I")
        if n_dims > 8:
            raise GGUFError(f"{self.path}: corrupt GGUF file (tensor {name!r} has {n_dims} dimensions)")
        self.keep(_TENSOR_COST)
        shape = tuple(self.scalar("<Q") for _ in range(n_dims))
        return TensorInfo(name, shape, self.scalar("<I"), self.scalar("<Q"))


@dataclass(frozen=True)
class SkippedArray:
    """An array read past, not kept: its length and its items' value type."""

    length: int
    item_type: int = _STRING

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True)
class SkippedString:
    """A value string longer than MAX_KEPT_STRING, read past: its length only."""

    length: int


def read_header(path: Path, *, with_tokens: bool = True) -> GGUFHeader:
    """The header of the GGUF file at path. Raises GGUFError (a ModelError) naming the file
    when it is not GGUF, is cut short or asks for more than Limits allow, NotRegularFile (one)
    when it is no regular file, OSError when it cannot be read. with_tokens=False skips the
    token list's texts (its length is kept): ~3x faster on a 150k vocabulary."""
    path = Path(path)
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise GGUFError(f"{path}: not a GGUF file ({size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != MAGIC:
                raise GGUFError(f"{path}: not a GGUF file (it starts with {bytes(buf[:4])!r}, not {MAGIC!r})")
            header = _parse(_Reader(buf, path, _KEPT_ARRAYS if with_tokens else ()), size)
    _check_complete(header)
    return header


def _parse(r: _Reader, size: int) -> GGUFHeader:
    path = r.path
    r.pos = 4
    version = r.scalar("<I")
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    num_tensors, num_kv = r.scalar("<Q"), r.scalar("<Q")
    if num_tensors > min(size, MAX_TENSORS) or num_kv > min(size, MAX_KEYS):
        raise GGUFError(f"{path}: corrupt GGUF file ({num_tensors:,} tensors, {num_kv:,} keys)")
    metadata: dict[str, object] = {}
    for _ in range(num_kv):
        key = r.name("key")
        metadata[key] = r.value(r.scalar("<I"), key)
    tensors = tuple(r.tensor() for _ in range(num_tensors))
    align = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(align, bool) or not isinstance(align, int) or not 0 < align < 2**32 or align & (align - 1):
        raise GGUFError(f"{path}: corrupt GGUF file (general.alignment {_shown(align)}, not a power of two)")
    # Each weight takes a bit at least (the smallest types, ~1.56 bits): more elements than that
    # are a lying shape (and an absurd parameter count and memory estimate).
    if sum(t.num_elements for t in tensors) > 8 * size:
        raise GGUFError(f"{path}: corrupt GGUF file (its tensor shapes hold more weights than its {size:,} bytes)")
    data_offset = -(-r.pos // align) * align
    vocabulary_id = r.vocabulary_id if isinstance(metadata.get(TOKENS_KEY), (list, SkippedArray)) else None
    return GGUFHeader(path, version, metadata, tensors, data_offset, size, vocabulary_id)


def _shown(value: object) -> str:
    """A metadata value for a message, cut short: 'nan', "'abc'", '[1, 2, 3, …]'."""
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _check_complete(header: GGUFHeader) -> None:
    """A file whose tensor data ends before its last tensor does is truncated (a download cut short)."""
    end = max((t.offset + (t.num_bytes or 0) for t in header.tensors), default=0)
    # NOTE: without tensors there is no data to need (a vocabulary-only file ends unpadded);
    # facts_of says such a file is no model.
    if header.tensors and header.data_offset + end > header.file_size:
        raise GGUFError(
            f"{header.path}: truncated GGUF file ({header.file_size:,} bytes where its tensors need "
            f"{header.data_offset + end:,}); download it again"
        )
