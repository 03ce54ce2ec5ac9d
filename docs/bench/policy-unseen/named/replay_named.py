"""Replay a corpus split's edits and copies with the instruction's named words as a hint: the
tokens where a word that the prompt's prose names in backticks (`parse_header`) occurs in its code
start with a diverged token's record (auto.DIVERGED_PRIOR), as if a copy had already broken there.
The variants:

- "base": the policy as it is.
- "named": the first token of each occurrence of a named word in the prompt's code.
- "named_all": every token that overlaps such an occurrence.
- "named_after": the first token of an occurrence and the token after its end.
- "named_soft": as "named", the record starting at 3 hits of 3 (rated 0.8, not 0.5).

    python docs/bench/policy-unseen/named/replay_named.py base,named,named_all,named_after,named_soft \
        corpus/dev.jsonl docs/bench/policy-unseen/zen4/curve.json

The variants wrap the policy's methods in this script; the policy has no such options.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location("variants", Path(__file__).parents[1] / "zen4" / "replay_variants.py")
variants = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variants)

Policy = variants.Policy
variants.ORIGINAL["begin"] = Policy.begin
FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.S)
TICKED = re.compile(r"`([^`\n]+)`")
WORD = re.compile(r"[A-Za-z_]\w+")
TOKENIZER = None


def named_tokens(tokens, mode: str) -> set[int]:
    """The token ids at the prompt's code's occurrences of the words its prose names."""
    pieces = [TOKENIZER.decode([t]) for t in tokens]
    starts, pos = [], 0
    for p in pieces:
        starts.append(pos)
        pos += len(p)
    text = "".join(pieces)
    code = [(m.start(1), m.end(1)) for m in FENCE.finditer(text)]
    prose, last = [], 0
    for a, b in code:
        prose.append(text[last:a])
        last = b
    prose.append(text[last:])
    named = {w for part in prose for span in TICKED.findall(part) for w in WORD.findall(span)}
    out: set[int] = set()

    def token_at(char: int) -> int:
        lo, hi = 0, len(starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid] <= char:
                lo = mid
            else:
                hi = mid - 1
        return lo

    for a, b in code:
        for m in WORD.finditer(text, a, b):
            if m.group() in named:
                first, end = token_at(m.start()), token_at(m.end() - 1)
                out.add(tokens[first])
                if mode == "all":
                    out.update(tokens[first : end + 1])
                elif mode == "after" and end + 1 < len(tokens):
                    out.add(tokens[end + 1])
    return out


def hinted(mode: str, seed: tuple[float, float] = (0.0, 0.0)):
    def begin(self, drafters, speculation):
        variants.ORIGINAL["begin"](self, drafters, speculation)
        self._named_done = False

    def menu(self, state):
        if not getattr(self, "_named_done", True):
            self._named_done = True
            for t in named_tokens(list(state.context), mode):
                self._diverged.setdefault(t, list(seed))
        return variants.ORIGINAL["menu"](self, state)

    return {"begin": begin, "menu": menu}


variants.VARIANTS.update(
    {
        "named": hinted("first"),
        "named_all": hinted("all"),
        "named_after": hinted("after"),
        "named_soft": hinted("first", (3.0, 3.0)),
    }
)

if __name__ == "__main__":
    from draftwise import models
    from draftwise.loading import LoadOptions, load_backend

    backend = load_backend(models.DEFAULT_TARGET, LoadOptions(n_ctx=256))
    TOKENIZER = backend.tokenizer  # kept open: the tokenizer reads the model
    variants.main(sys.argv[1].split(","), *sys.argv[2:4])
