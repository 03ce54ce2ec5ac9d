"""Retrieval datastore drafter (after REST, arXiv 2311.08252) and its on-disk index.

`build_datastore` tokenises a corpus with the target's tokenizer into tokens.npy and a
suffix array sa.npy (sorted by the first DEPTH tokens; memory-mapped when loaded).
The drafter finds the longest context suffix in the corpus by binary search and
proposes the most frequent continuation among its occurrences.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from draftwise.drafters.base import BaseDrafter
from draftwise.drafters.continuation import frequency_walk
from draftwise.types import Draft

DEPTH = 64  # suffixes are sorted by their first DEPTH tokens: matches are capped there
MAX_MATCH = 32
MAX_OCCURRENCES = 256
FORMAT_VERSION = 1


def suffix_array(tokens: np.ndarray, depth: int = DEPTH) -> np.ndarray:
    """Suffix array by prefix doubling (numpy), ordered by the first `depth` tokens.

    Example: [2, 1, 2, 1] -> suffixes "2121", "121", "21", "1" sort as [3, 1, 2, 0].
    Ties beyond depth are broken by position (stable), which matching never needs.
    """
    n = len(tokens)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    _, rank = np.unique(tokens, return_inverse=True)
    rank = rank.astype(np.int64)
    k = 1
    while k < depth:
        second = np.full(n, -1, dtype=np.int64)
        second[: n - k] = rank[k:]
        order = np.lexsort((second, rank))
        r1, r2 = rank[order], second[order]
        new_group = np.concatenate([[0], np.cumsum((r1[1:] != r1[:-1]) | (r2[1:] != r2[:-1]))])
        rank = np.empty(n, dtype=np.int64)
        rank[order] = new_group
        if new_group[-1] == n - 1:
            break
        k *= 2
    return np.argsort(rank, kind="stable")


def build_datastore(
    texts: Iterable[tuple[str, str]],
    encode: Callable[[str], list[int]],
    out: Path,
    *,
    max_tokens: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """texts: (name, text) pairs. Writes out/tokens.npy, out/sa.npy, out/meta.json."""
    t0 = time.perf_counter()
    chunks: list[np.ndarray] = []
    num_docs = num_tokens = 0
    for _name, text in texts:
        ids = encode(text)
        if not ids:
            continue
        num_docs += 1
        # NOTE: every document ends with its own negative separator, so no match crosses files.
        chunks.append(np.asarray([*ids, -num_docs], dtype=np.int32))
        num_tokens += len(ids)
        if progress and num_docs % 100 == 0:
            progress(f"tokenised {num_docs} files, {num_tokens:,} tokens")
        if max_tokens is not None and num_tokens >= max_tokens:
            break
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
    t1 = time.perf_counter()
    if progress:
        progress(f"building the suffix array over {len(tokens):,} positions")
    sa = suffix_array(tokens)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "tokens.npy", tokens)
    np.save(out / "sa.npy", sa.astype(np.int64 if len(tokens) >= 2**31 else np.int32))
    meta = {
        "version": FORMAT_VERSION,
        "num_docs": num_docs,
        "num_tokens": num_tokens,
        "tokenize_s": round(t1 - t0, 2),
        "suffix_array_s": round(time.perf_counter() - t1, 2),
        "bytes": (out / "tokens.npy").stat().st_size + (out / "sa.npy").stat().st_size,
    }
    (out / "meta.json").write_text(json.dumps(meta))
    return meta


class DatastoreDrafter(BaseDrafter):
    free = True

    def __init__(
        self, path: str | Path, min_match: int = 2, min_confidence: float = 0.2, name: str = "datastore"
    ) -> None:
        path = Path(path)
        if not (path / "sa.npy").is_file():
            raise FileNotFoundError(f"no datastore at {path} (build one with `draftwise index build`)")
        self.tokens = np.load(path / "tokens.npy", mmap_mode="r")
        self.sa = np.load(path / "sa.npy", mmap_mode="r")
        self.meta = json.loads((path / "meta.json").read_text())
        self.min_match, self.min_confidence, self.name = min_match, min_confidence, name

    def for_slot(self, slot: int) -> DatastoreDrafter:
        """Another slot's drafter over the same (read-only, memory-mapped) datastore."""
        return copy.copy(self)

    def memory_bytes(self) -> int:
        """The corpus's tokens and suffix array, memory-mapped read-only (resident as the pages
        are read; the kernel may drop them again). Fixed at load: the size of the datastore on
        disk (4 + 4 bytes a corpus token, `draftwise index build --max-tokens` bounds it), shared
        by every slot's copy, growing with nothing."""
        return int(self.tokens.nbytes + self.sa.nbytes)

    def _compare(self, start: int, pattern: list[int]) -> int:
        """Sign of corpus[start:start+m] vs pattern, lexicographically (shorter = smaller)."""
        # NOTE: Python lists compare lexicographically, shorter first, in C; a few tokens
        # as a list beat numpy's per-call overhead.
        window = self.tokens[start : start + len(pattern)].tolist()
        return 0 if window == pattern else -1 if window < pattern else 1

    def _range(self, pattern: list[int]) -> tuple[int, int]:
        """[lo, hi) of suffix-array entries starting with pattern."""
        sa, compare = self.sa, self._compare
        lo, hi = 0, len(sa)
        while lo < hi:
            mid = (lo + hi) // 2
            if compare(int(sa[mid]), pattern) < 0:
                lo = mid + 1
            else:
                hi = mid
        first, hi = lo, len(sa)
        while lo < hi:
            mid = (lo + hi) // 2
            if compare(int(sa[mid]), pattern) <= 0:
                lo = mid + 1
            else:
                hi = mid
        return first, lo

    def match(self, context: Sequence[int]) -> tuple[list[int], int]:
        """Continuation starts for the longest context suffix in the corpus (binary search on length)."""
        tail = [int(t) for t in context[-MAX_MATCH:]]
        best: tuple[int, list[int]] = (0, [])
        lo_len, hi_len = self.min_match, len(tail)
        # Occurrence with a continuation is monotone in length (a match of m tokens
        # contains one of m - 1 with the same next token), so binary search on it.
        while lo_len <= hi_len:
            m = (lo_len + hi_len) // 2
            starts = self._continuations(*self._range(tail[len(tail) - m :]), m)
            if starts:
                best, lo_len = (m, starts), m + 1
            else:
                hi_len = m - 1
        m, starts = best
        return starts, m

    def _continuations(self, first: int, last: int, m: int) -> list[int]:
        """Where the next token follows each of (up to MAX_OCCURRENCES) matches; a match that
        ends its document has none."""
        if last <= first:
            return []
        starts = np.asarray(self.sa[first : min(last, first + MAX_OCCURRENCES)], dtype=np.int64) + m
        starts = starts[starts < len(self.tokens)]
        return [int(s) for s in starts[np.asarray(self.tokens[starts]) >= 0]]

    def _token_at(self, p: int) -> int | None:
        if p >= len(self.tokens):
            return None
        t = int(self.tokens[p])
        return None if t < 0 else t

    def propose(self, context: Sequence[int], max_tokens: int, grammar=None) -> Draft:
        positions, length = self.match(context)
        if not positions or max_tokens <= 0:
            return Draft((), source=self.name)
        proposal, _ = frequency_walk(self._token_at, positions, max_tokens, self.min_confidence)
        return Draft(tuple(proposal), source=self.name, score=float(length))


def stdlib_sources(max_files: int | None = None) -> list[tuple[str, str]]:
    """(path, text) of the running Python's standard library sources, tests excluded."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "lib2to3", "__pycache__"}
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
    out = []
    for p in files[:max_files]:
        try:
            out.append((str(p), p.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return out
