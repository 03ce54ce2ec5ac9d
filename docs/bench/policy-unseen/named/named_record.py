"""How often a copy is right at the words the instruction names: replay a corpus split with
replay_named.py's "named" variant and add up, per request, the records its named tokens ended
with (hits: a proposal that held the token and the answer wrote it; trials: every such proposal
judged there). The last request's records are not counted.

    python docs/bench/policy-unseen/named/named_record.py corpus/dev.jsonl docs/bench/policy-unseen/zen4/curve.json
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from draftwise import models
from draftwise.loading import LoadOptions, load_backend

named = runpy.run_path(str(Path(__file__).with_name("replay_named.py")), run_name="replay_named")
variants = named["variants"]
hint = variants.VARIANTS["named"]
total = [0.0, 0.0]


def begin(self, drafters, speculation) -> None:
    for token in getattr(self, "_seeded", ()):
        record = self._diverged.get(token)
        if record:
            total[0], total[1] = total[0] + record[0], total[1] + record[1]
    hint["begin"](self, drafters, speculation)


def menu(self, state):
    first = not self._named_done
    out = hint["menu"](self, state)
    if first:
        self._seeded = set(self._diverged)
    return out


if __name__ == "__main__":
    backend = load_backend(models.DEFAULT_TARGET, LoadOptions(n_ctx=256))
    named["named_tokens"].__globals__["TOKENIZER"] = backend.tokenizer
    variants.VARIANTS["record"] = {"begin": begin, "menu": menu}
    variants.main(["record"], *sys.argv[1:3])
    print(
        f"named tokens judged in proposals: {total[0]:.0f} right of {total[1]:.0f} ({total[0] / max(1, total[1]):.3f})"
    )
