"""Datastore lookup latency: list comparisons (shipped) vs the earlier numpy comparisons, same contexts.

Usage: python scripts/measure_datastore_latency.py DATASTORE_DIR   (e.g. one built by `draftwise index stdlib`)
"""

import sys
import time

import numpy as np

from draftwise.drafters.datastore import DatastoreDrafter


class Old(DatastoreDrafter):
    """The comparison as it was: three numpy calls per suffix-array probe."""

    def _compare(self, start, pattern):
        pattern = np.asarray(pattern, dtype=np.int32)
        window = np.asarray(self.tokens[start : start + len(pattern)])
        m = len(window)
        diff = np.flatnonzero(window != pattern[:m])
        if diff.size:
            return -1 if window[diff[0]] < pattern[diff[0]] else 1
        return 0 if m == len(pattern) else -1


path = sys.argv[1]
new, old = DatastoreDrafter(path), Old(path)
toks = np.load(f"{path}/tokens.npy", mmap_mode="r")
rng = np.random.default_rng(0)
contexts = []
for s in rng.integers(0, len(toks) - 100, 200):  # half found verbatim, half with a random last token
    c = [int(t) for t in toks[s : s + 64] if t >= 0]
    contexts.append(c[:-1] + [int(rng.integers(0, 150000))] if len(contexts) % 2 else c)
for name, d in (("old", old), ("new", new), ("old", old), ("new", new)):
    t0 = time.perf_counter()
    for c in contexts:
        d.propose(c, 16)
    print(name, f"{1000 * (time.perf_counter() - t0) / len(contexts):.3f} ms/lookup")
assert [old.propose(c, 16).token_ids for c in contexts] == [new.propose(c, 16).token_ids for c in contexts]
print("same proposals")
