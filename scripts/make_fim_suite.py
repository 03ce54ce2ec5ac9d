#!/usr/bin/env python
"""Build the bench's `fim` suite (src/draftwise/bench/suites/fim.jsonl): one cut per source file.

A cut removes 1-6 whole lines from a function body: whole statements in Python (found with ast),
and in C, C++ and JavaScript lines inside a function whose braces and parentheses balance, starting
after a statement ends. The prompt is up to 256 lines before the cut and the suffix up to 64 after,
as llama.vim sends them; the reference is the removed text. The choice is seeded by the file's
name, so a rerun on the same files writes the same suite. The files and their licences are listed
in SOURCES below and in suites/README.md.

    scripts/make_fim_suite.py [--out src/draftwise/bench/suites/fim.jsonl]
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import sysconfig
from pathlib import Path

LINES_BEFORE, LINES_AFTER, MAX_CUT = 256, 64, 6
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


def python_cuts(text: str) -> list[tuple[int, int]]:
    """(first line, last line), 0-based inclusive: runs of whole statements in a function body
    (the docstring excluded) spanning 1..MAX_CUT lines."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        blocks = [node.body] + [
            getattr(inner, field)
            for inner in ast.walk(node)
            if inner is not node and isinstance(inner, ast.stmt)
            for field in ("body", "orelse", "finalbody")
            if isinstance(getattr(inner, field, None), list)
        ]
        for block in blocks:
            stmts = [
                s
                for s in block
                if not (
                    isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
                )
                and not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            ]
            for i in range(len(stmts)):
                for j in range(i, len(stmts)):
                    first, last = stmts[i].lineno - 1, stmts[j].end_lineno - 1
                    if last - first + 1 > MAX_CUT:
                        break
                    out.append((first, last))
    return out


HEADER = re.compile(r"^(\s*)(?!(if|for|while|switch|else|do|catch|return|try)\b)[^;#/*]*\([^;]*\)[^;]*\{\s*$")


def brace_cuts(text: str) -> list[tuple[int, int]]:
    """Cuts inside functions of C, C++ or JavaScript: a header line ending in "{" (or followed by a
    line holding only "{") opens a body
    that ends at the "}" with the header's indentation; a cut's lines are indented deeper, its
    brackets balance, its first line is not blank, and the line before it ends a statement or
    opens a block."""
    lines = text.split("\n")
    out = []
    for h, line in enumerate(lines):
        match = HEADER.match(line)
        if not match and line.strip() == "{" and h and HEADER.match(lines[h - 1] + " {"):
            match = re.match(r"(\s*)", line)  # K&R: the brace on its own line under the header
        if not match:
            continue
        indent = match.group(1)
        end = next(
            (e for e in range(h + 1, len(lines)) if re.fullmatch(re.escape(indent) + r"\};?\s*", lines[e])), None
        )
        if end is None:
            continue
        for first in range(h + 1, end):
            before = lines[first - 1].rstrip()
            if not (before.endswith((";", "{", "}")) or not before.strip()):
                continue
            for last in range(first, min(first + MAX_CUT, end)):
                cut = lines[first : last + 1]
                if any(s.strip() and len(s) - len(s.lstrip()) <= len(indent) for s in cut):
                    break
                if cut[0].strip() and balanced("\n".join(cut)) and cut[-1].rstrip().endswith((";", "}")):
                    out.append((first, last))
    return out


def balanced(text: str) -> bool:
    """Every bracket closes one the text opened (strings and comments are not told apart).
    Example: "f(a[0]);" -> True; "}\\nelse {" -> False."""
    depth = {"{": 0, "(": 0, "[": 0}
    closes = {"}": "{", ")": "(", "]": "["}
    for c in text:
        if c in depth:
            depth[c] += 1
        elif c in closes:
            depth[closes[c]] -= 1
            if depth[closes[c]] < 0:
                return False
    return not any(depth.values())


def is_code(lines: list[str]) -> bool:
    """Not blank or comments only, and some line with a few characters of code."""
    code = [s.strip() for s in lines if s.strip() and not s.strip().startswith(("#", "//", "/*", "*"))]
    return bool(code) and max(len(s) for s in code) >= 12


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
    prefix = "".join(line + "\n" for line in lines[max(0, first - LINES_BEFORE) : first])
    middle = "".join(line + "\n" for line in lines[first : last + 1])
    after = lines[last + 1 : last + 1 + LINES_AFTER]
    suffix = "\n".join(after) + ("\n" if last + 1 + LINES_AFTER < len(lines) else "")
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
