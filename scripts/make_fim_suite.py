#!/usr/bin/env python
"""Build the bench's `fim` suite (src/draftwise/bench/suites/fim.jsonl): one cut per source file.

A cut removes 1-6 whole lines from a function body: whole statements in Python (found with ast),
and in C, C++ and JavaScript lines inside a function whose braces and parentheses balance, starting
after a statement ends. The prompt is up to 256 lines before the cut and the suffix up to 64 after,
as llama.vim sends them; the reference is the removed text. The choice is seeded by the file's
name, so a rerun on the same files writes the same suite. The files and their licences are listed
in SOURCES below and in suites/README.md. The cutting functions live in draftwise.bench.corpus.code,
which the development corpus (`draftwise corpus`) shares.

    scripts/make_fim_suite.py [--out src/draftwise/bench/suites/fim.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
import sysconfig
from pathlib import Path

from draftwise.bench.corpus.code import MAX_CUT, brace_cuts, fim_parts, is_code, python_cuts

FIRST_ID = 1301
STDLIB = Path(sysconfig.get_paths()["stdlib"])
LLAMA_CPP = Path("/tmp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp")
NPM = Path("/usr/lib/node_modules/npm/node_modules")
DOC = Path("/usr/share/doc")

# (language, root, path under it, licence)
SOURCES = [
    *(
        ("python", STDLIB, name, "PSF-2.0")
        for name in (
            "json/encoder.py",
            "textwrap.py",
            "shlex.py",
            "difflib.py",
            "fractions.py",
            "heapq.py",
            "statistics.py",
            "csv.py",
            "configparser.py",
            "ipaddress.py",
        )
    ),
    ("c", DOC, "zlib1g-dev/examples/zran.c", "Zlib"),
    ("c", DOC, "zlib1g-dev/examples/gun.c", "Zlib"),
    ("c", DOC, "zlib1g-dev/examples/enough.c", "Zlib"),
    ("c", DOC, "zlib1g-dev/examples/fitblk.c", "public domain"),
    ("c", DOC, "libjansson4/examples/json_process.c", "MIT"),
    ("c", DOC, "liblzma-dev/examples/02_decompress.c", "public domain"),
    ("cpp", LLAMA_CPP, "src/llama-vocab.cpp", "MIT"),
    ("cpp", LLAMA_CPP, "src/llama-sampler.cpp", "MIT"),
    ("cpp", LLAMA_CPP, "common/common.cpp", "MIT"),
    ("cpp", LLAMA_CPP, "common/sampling.cpp", "MIT"),
    ("cpp", LLAMA_CPP, "examples/lookup/lookup.cpp", "MIT"),
    ("cpp", LLAMA_CPP, "examples/parallel/parallel.cpp", "MIT"),
    ("javascript", NPM, "semver/classes/semver.js", "ISC"),
    ("javascript", NPM, "semver/classes/range.js", "ISC"),
    ("javascript", NPM, "ini/lib/ini.js", "ISC"),
    ("javascript", NPM, "ms/index.js", "MIT"),
    ("javascript", NPM, "npm-package-arg/lib/npa.js", "ISC"),
    ("javascript", NPM, "hosted-git-info/lib/index.js", "ISC"),
]


def make_cut(language: str, root: Path, path: str, licence: str, question_id: int) -> dict:
    text = (root / path).read_text(encoding="utf-8")
    lines = text.split("\n")
    spans = [
        (a, b)
        for a, b in (python_cuts(text) if language == "python" else brace_cuts(text))
        if is_code(lines[a : b + 1]) and a >= 8
    ]
    rng = random.Random(path)
    size = rng.randint(1, MAX_CUT)
    sized = [s for s in spans if s[1] - s[0] + 1 == size] or spans
    first, last = rng.choice(sorted(set(sized)))
    prefix, middle, suffix = fim_parts(lines, first, last)
    return {
        "question_id": question_id,
        "category": "fim",
        "turns": [prefix],
        "suffix": suffix,
        "reference": middle,
        "language": language,
        "source": f"{path}:{first + 1}-{last + 1}",
        "licence": licence,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="src/draftwise/bench/suites/fim.jsonl")
    args = parser.parse_args()
    with open(args.out, "w", encoding="utf-8") as f:
        for i, (language, root, path, licence) in enumerate(SOURCES):
            f.write(json.dumps(make_cut(language, root, path, licence, FIRST_ID + i)) + "\n")
    print(f"{len(SOURCES)} cuts -> {args.out}")


if __name__ == "__main__":
    main()
