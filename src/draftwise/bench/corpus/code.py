"""The shape of a source file, as the corpus generator (bench/corpus/build.py) needs it.

Definitions at one nesting level ("units": Python statements found with `ast`; in C, C++,
JavaScript and Go, blocks found by bracket depth and indentation), regions made of whole runs of
them, the definition a `copy` task quotes, and the fill-in-the-middle cuts the bench's `fim` suite
is made of (`scripts/make_fim_suite.py` imports those from here).
"""

from __future__ import annotations

import ast
import random
import re
import sys
from dataclasses import dataclass

MAX_CUT = 6  # a fill-in-the-middle cut removes 1..MAX_CUT whole lines
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
DEFINITIONS = (*FUNCTIONS, ast.ClassDef)
TRIES = (ast.Try, ast.TryStar) if sys.version_info >= (3, 11) else (ast.Try,)
COMMENT_STARTS = ("//", "/*", "*")


@dataclass(frozen=True)
class Unit:
    """One statement or definition at a region's level: lines start..end (0-based, inclusive)."""

    start: int
    end: int
    name: str | None = None  # a definition's name
    kind: str = "other"  # "function", "method", "class" (class, struct, enum, ...), "other"


@dataclass(frozen=True)
class Region:
    """Whole units of a file: file lines first..last (0-based, inclusive), dedented to `text`.

    `units` are numbered within `text` (line 0 is the file's line `first`); `indent` is what was
    removed from each line of a nested level (a class body), "" at the top level.
    """

    first: int
    last: int
    text: str
    units: tuple[Unit, ...]
    indent: str = ""

    @property
    def num_lines(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True)
class Limits:
    """The size of a region: min_lines..max_lines lines, at most max_chars characters."""

    min_lines: int
    max_lines: int
    max_chars: int


def indentation(line: str) -> str:
    """The leading whitespace. Example: "    x = 1" -> "    "."""
    return line[: len(line) - len(line.lstrip())]


# ---- Python -------------------------------------------------------------------------------


def python_units(body: list[ast.stmt], lines: list[str], kind: str) -> list[Unit]:
    """The statements of one body as units; a definition takes its decorators and the comment
    lines right above it (no blank line between). `kind` names a function at this level."""
    units = []
    floor = body[0].lineno - 1 if body else 0
    for node in body:
        start = min([node.lineno, *(d.lineno for d in decorators(node))]) - 1
        while start > floor and lines[start - 1].strip().startswith("#"):
            start -= 1
        name, node_kind = None, "other"
        if isinstance(node, DEFINITIONS):
            name, node_kind = node.name, "class" if isinstance(node, ast.ClassDef) else kind
        units.append(Unit(start, node.end_lineno - 1, name, node_kind))
        floor = node.end_lineno
    return units


def decorators(node: ast.stmt) -> list[ast.expr]:
    """A definition's decorators; none for any other statement."""
    return node.decorator_list if isinstance(node, DEFINITIONS) else []


def python_levels(text: str) -> list[tuple[list[Unit], str]]:
    """The module's top level and each top-level class body: (units, indentation) per level.
    Raises SyntaxError for a file that does not parse."""
    tree = ast.parse(text)
    lines = text.split("\n")
    levels = [(python_units(tree.body, lines, "function"), "")]
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and len(node.body) > 1:
            indent = indentation(lines[node.body[0].lineno - 1])
            if indent:
                levels.append((python_units(node.body, lines, "method"), indent))
    return levels


def defined_names(text: str) -> list[str]:
    """Names a Python text defines: definitions, parameters, assignment targets (not imports,
    whose names belong to other modules)."""
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, DEFINITIONS):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return sorted(names)


# ---- C, C++, JavaScript, Go -----------------------------------------------------------------


def bracket_depths(text: str) -> tuple[list[int], list[bool]]:
    """Per line: the bracket depth ((, [, {) at its start and whether it starts inside a block
    comment; strings, character literals and comments are skipped.

    Example: "f(a,\\n  b);\\nx;" -> ([0, 1, 0], [False, False, False]).
    """
    depths, in_comment = [0], [False]
    depth, state, i, n = 0, "", 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            if state in ('"', "'"):
                state = ""  # an unclosed quote ends with its line
            if state == "//":
                state = ""
            depths.append(depth)
            in_comment.append(state == "/*")
        elif state == "/*":
            if text.startswith("*/", i):
                state, i = "", i + 1
        elif state in ('"', "'", "`"):
            if c == "\\" and text[i + 1 : i + 2] != "\n":
                i += 1
            elif c == state:
                state = ""
        elif state == "//":
            pass
        elif text.startswith(("//", "/*"), i):
            state, i = text[i : i + 2], i + 1
        elif c in "\"'`":
            state = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        i += 1
    return depths, in_comment


def is_comment(line: str, in_block_comment: bool) -> bool:
    """A line holding only a comment (C-family)."""
    return in_block_comment or line.strip().startswith(COMMENT_STARTS)


UNIT_ENDS = (";", "}", "};", "})", "});", "},")


def brace_unit_end(lines: list[str], depths: list[int], comments: list[bool], start: int, stop: int) -> int:
    """The last line of the unit that starts at `start`: where the depth is back to the start's
    and the line ends a statement or a block, or is followed by a blank line."""
    depth = depths[start]
    for j in range(start, stop):
        line = lines[j].rstrip()
        after = depths[j + 1] if j + 1 < len(depths) else depth
        if after < depth:
            return max(start, j - 1)  # the level's closing bracket: the unit ended before it
        if after != depth or is_comment(line, comments[j]):
            continue
        if line.lstrip().startswith("#"):
            if not line.endswith("\\"):
                return j
        elif line.endswith(UNIT_ENDS) or j + 1 >= stop or not lines[j + 1].strip():
            return j
    return stop - 1


def brace_units(
    lines: list[str], depths: list[int], comments: list[bool], level: tuple[int, str, int, int]
) -> list[Unit]:
    """The units at (depth, indentation) between lines lo..hi (exclusive); comment lines right
    above a unit belong to it."""
    depth, indent, lo, hi = level
    units, i = [], lo
    while i < hi:
        line = lines[i]
        if not line.strip() or depths[i] != depth or indentation(line) != indent:
            i += 1
            continue
        start = i
        while i < hi and is_comment(lines[i], comments[i]) and lines[i].strip():
            i += 1
        if i >= hi or not lines[i].strip() or indentation(lines[i]) != indent:
            continue  # a comment on its own
        end = brace_unit_end(lines, depths, comments, i, hi)
        name, kind = brace_name(lines[i : end + 1])
        units.append(Unit(start, end, name, kind))
        i = end + 1
    return units


CLASS_HEADER = r"^(?:export\s+)?(?:default\s+)?(?:typedef\s+)?(?:template\s*<[^>]*>\s*)?"
NAME_PATTERNS = (
    (re.compile(CLASS_HEADER + r"(?:class|struct|enum|union|interface)\s+(\w+)"), "class"),
    (re.compile(r"^type\s+(\w+)\s+(?:struct|interface)\b"), "class"),
    (re.compile(r"^(?:export\s+)?(?:async\s+)?function\s*\*?\s*(\w+)\s*\("), "function"),
    (re.compile(r"^func\s+(?:\([^)]*\)\s*)?(\w+)\s*\("), "function"),
    (
        re.compile(
            r"^(?:export\s+)?(?:const|let|var)\s+(\w+)\s*=\s*(?:async\s+)?(?:function\b|\([^)]*\)\s*=>|\w+\s*=>)"
        ),
        "function",
    ),
    (re.compile(r"^(?:static\s+)?(?:async\s+)?(?:get\s+|set\s+)?(\w+)\s*\([^;]*$"), "function"),
    (re.compile(r"^[\w\s\*&:<>,]*?[\s\*&:](\w+)\s*\([^;]*$"), "function"),
)
NOT_NAMES = {"if", "for", "while", "switch", "return", "sizeof", "catch", "do", "else", "defined", "new", "typeof"}


def brace_name(unit: list[str]) -> tuple[str | None, str]:
    """A block's name and kind from its header, when it has a block: ("main", "function") for
    "int main(void)\\n{ ... }"; (None, "other") for a declaration or a macro."""
    code = [s.strip() for s in unit if s.strip() and not s.strip().startswith(COMMENT_STARTS)]
    if not code or "{" not in "".join(code) or code[0].startswith("#"):
        return None, "other"
    header = " ".join(code[: next((i for i, s in enumerate(code) if "{" in s), 0) + 1])
    for pattern, kind in NAME_PATTERNS:
        match = pattern.match(header)
        if match and match.group(1) not in NOT_NAMES:
            return match.group(1), kind
    match = re.search(r"\}\s*(\w+)\s*;$", code[-1])  # typedef struct { ... } name;
    if match and header.startswith("typedef"):
        return match.group(1), "class"
    return None, "other"


def brace_levels(text: str) -> list[tuple[list[Unit], str]]:
    """The file's top level and the inside of each top-level block long enough to hold a
    region (a class body, an `extern "C"` or namespace block, a module's closure)."""
    lines = text.split("\n")
    depths, comments = bracket_depths(text)
    top = brace_units(lines, depths, comments, (0, "", 0, len(lines)))
    levels = [(top, "")]
    for unit in top:
        if unit.end - unit.start < 40:
            continue
        inner = next((i for i in range(unit.start + 1, unit.end) if lines[i].strip() and depths[i] > 0), None)
        if inner is None:
            continue
        indent = indentation(lines[inner])
        units = brace_units(lines, depths, comments, (depths[inner], indent, inner, unit.end))
        levels.append(([u if u.kind != "function" else Unit(u.start, u.end, u.name, "method") for u in units], indent))
    return levels


# ---- regions ---------------------------------------------------------------------------------


def levels_of(text: str, language: str) -> list[tuple[list[Unit], str]]:
    """The levels a file's regions are made from; none for a Python file that does not parse."""
    if language != "python":
        return brace_levels(text)
    try:
        return python_levels(text)
    except (SyntaxError, ValueError, RecursionError):
        return []


def dedent(lines: list[str], indent: str) -> list[str] | None:
    """The lines without `indent`; None if a non-blank line does not start with it."""
    if any(s.strip() and not s.startswith(indent) for s in lines):
        return None
    return [s[len(indent) :] for s in lines]


def region_spans(lines: list[str], levels: list[tuple[list[Unit], str]], limits: Limits) -> list[tuple[int, int, int]]:
    """Every run of whole units at one level that fits `limits`: (level, first unit, last unit).

    Sizes come from running sums, so a long file costs one pass per level and run length.
    """
    out = []
    for index, (units, indent) in enumerate(levels):
        chars, misfits = [0], [0]  # running sums: dedented characters; lines that lack the indent
        for s in lines:
            chars.append(chars[-1] + len(s) + 1 - (len(indent) if s.strip() else 0))
            misfits.append(misfits[-1] + bool(s.strip() and not s.startswith(indent)))
        for i, head in enumerate(units):
            for j in range(i, len(units)):
                first, last = head.start, units[j].end
                size = chars[last + 1] - chars[first] - 1
                if last - first + 1 > limits.max_lines or size > limits.max_chars or misfits[last + 1] > misfits[first]:
                    break
                if last - first + 1 >= limits.min_lines:
                    out.append((index, i, j))
    return out


def make_region(lines: list[str], levels: list[tuple[list[Unit], str]], span: tuple[int, int, int]) -> Region:
    """The region of one span from region_spans."""
    index, i, j = span
    units, indent = levels[index]
    first, last = units[i].start, units[j].end
    body = dedent(lines[first : last + 1], indent) or []
    inner = tuple(Unit(u.start - first, u.end - first, u.name, u.kind) for u in units[i : j + 1])
    return Region(first, last, "\n".join(body), inner, indent)


@dataclass(frozen=True)
class Shape:
    """A file's lines and the levels its regions are made from (levels_of), computed once."""

    lines: list[str]
    levels: list[tuple[list[Unit], str]]
    python: bool


def shape_of(text: str, language: str) -> Shape:
    """The file's Shape; a Python file that does not parse has no levels."""
    return Shape(text.split("\n"), levels_of(text, language), language == "python")


def pick_regions(shape: Shape, limits: Limits, rng: random.Random, tries: int = 8) -> list[Region]:
    """Up to `tries` regions of the file that fit `limits`, drawn by `rng`; a Python region
    always parses, and none holds a code fence (```), which would end the prompt's code block."""
    spans = region_spans(shape.lines, shape.levels, limits)
    chosen = [make_region(shape.lines, shape.levels, s) for s in rng.sample(spans, min(tries, len(spans)))]
    return [r for r in chosen if "```" not in r.text and (not shape.python or parses(r.text))]


def parses(text: str) -> bool:
    """Python text that ast parses."""
    try:
        ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return False
    return True


def without_comments(lines: list[str]) -> list[str]:
    """A C-family block without the comment lines above its header.

    Example: ["/* A point. */", "struct p {", "int x;", "};"] -> ["struct p {", "int x;", "};"].
    """
    in_block = False
    for i, line in enumerate(lines):
        stripped = line.strip()
        if in_block:
            in_block = "*/" not in stripped
        elif stripped.startswith("/*"):
            in_block = "*/" not in stripped[2:]
        elif stripped and not stripped.startswith("//"):
            return lines[i:]
    return lines


@dataclass(frozen=True)
class Definition:
    """A definition a `copy` task quotes: its text and how the instruction names it."""

    name: str
    kind: str  # "function", "method", "class"
    text: str
    owner: str | None = None  # a method's class


def python_definitions(text: str) -> list[Definition]:
    """The region's top-level functions and classes and its classes' methods."""
    lines = text.split("\n")
    out = []
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, DEFINITIONS):
            out.append(
                Definition(
                    node.name, "class" if isinstance(node, ast.ClassDef) else "function", definition_text(node, lines)
                )
            )
        if isinstance(node, ast.ClassDef):
            out.extend(
                Definition(inner.name, "method", definition_text(inner, lines), node.name)
                for inner in node.body
                if isinstance(inner, FUNCTIONS)
            )
    return out


def definition_text(node: ast.stmt, lines: list[str]) -> str:
    """A definition's lines, decorators included."""
    start = min([node.lineno, *(d.lineno for d in decorators(node))]) - 1
    return "\n".join(lines[start : node.end_lineno])


def definitions(region: Region, language: str) -> list[Definition]:
    """Named definitions of the region whose name no other definition in it shares."""
    if language == "python":
        found = python_definitions(region.text)
    else:
        lines = region.text.split("\n")
        found = [
            Definition(u.name, u.kind, "\n".join(without_comments(lines[u.start : u.end + 1])))
            for u in region.units
            if u.name and u.kind != "other"
        ]
    names = [d.name for d in found]
    return [d for d in found if names.count(d.name) == 1]


# ---- fill-in-the-middle cuts (also scripts/make_fim_suite.py) -----------------------------------


def inner_blocks(node: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists nested directly in a statement: body, orelse and finalbody."""
    if isinstance(node, ast.For | ast.AsyncFor | ast.While | ast.If):
        return [node.body, node.orelse]
    if isinstance(node, TRIES):
        return [node.body, node.orelse, node.finalbody]
    if isinstance(node, ast.With | ast.AsyncWith | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.body]
    return []


def python_cuts(text: str) -> list[tuple[int, int]]:
    """(first line, last line), 0-based inclusive: runs of whole statements in a function body
    (the docstring excluded) spanning 1..MAX_CUT lines."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, FUNCTIONS):
            continue
        blocks = [node.body] + [
            block
            for inner in ast.walk(node)
            if inner is not node and isinstance(inner, ast.stmt)
            for block in inner_blocks(inner)
        ]
        for block in blocks:
            stmts = [
                s
                for s in block
                if not (
                    isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
                )
                and not isinstance(s, DEFINITIONS)
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


LINES_BEFORE, LINES_AFTER = 256, 64  # a fim prompt, as llama.vim sends it


def fim_parts(lines: list[str], first: int, last: int) -> tuple[str, str, str]:
    """(prefix, middle, suffix) of a cut of lines first..last (0-based, inclusive): up to
    LINES_BEFORE lines before it and LINES_AFTER after, as llama.vim sends them.
    Example: fim_parts(["a", "b", "c"], 1, 1) == ("a\n", "b\n", "c")."""
    prefix = "".join(line + "\n" for line in lines[max(0, first - LINES_BEFORE) : first])
    middle = "".join(line + "\n" for line in lines[first : last + 1])
    after = lines[last + 1 : last + 1 + LINES_AFTER]
    suffix = "\n".join(after) + ("\n" if last + 1 + LINES_AFTER < len(lines) else "")
    return prefix, middle, suffix


def is_code(lines: list[str]) -> bool:
    """Not blank or comments only, and some line with a few characters of code."""
    code = [s.strip() for s in lines if s.strip() and not s.strip().startswith(("#", "//", "/*", "*"))]
    return bool(code) and max(len(s) for s in code) >= 12


def fim_spans(text: str, language: str) -> list[tuple[int, int]]:
    """The cuts of a file that hold code and leave at least 8 lines before them, sorted."""
    lines = text.split("\n")
    try:
        spans = python_cuts(text) if language == "python" else brace_cuts(text)
    except (SyntaxError, ValueError, RecursionError):
        return []
    return sorted({(a, b) for a, b in spans if is_code(lines[a : b + 1]) and a >= 8})
