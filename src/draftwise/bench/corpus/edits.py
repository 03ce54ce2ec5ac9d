"""The edits of the corpus's `edit` tasks (bench/corpus/build.py): each takes a region of a file and
returns the instruction a user would give and the region as it reads after the edit, or None
when the region offers nothing to edit that way.

- rename: an identifier the region uses at least 3 times gets a new name everywhere (word
  boundaries, so in comments and strings too).
- add_parameter (Python): one function gets a keyword parameter with a default, after the others.
- add_docstrings (Python): every function without a docstring gets `\"\"\"<Name words>.\"\"\"`.
- reorder: two named definitions of the region change places.
- change_line (a region of 100+ lines): one number, short string or comparison on one line.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from draftwise.bench.corpus.code import FUNCTIONS, Limits, Region, decorators, defined_names, indentation

EDIT_KINDS = ("rename", "add_parameter", "add_docstrings", "reorder", "change_line")
PYTHON_ONLY = ("add_parameter", "add_docstrings")
EDIT_LIMITS = Limits(min_lines=40, max_lines=160, max_chars=4_500)
LONG_LIMITS = Limits(min_lines=100, max_lines=160, max_chars=4_500)  # change_line: "a long file"
MAX_ANSWER_CHARS = 5_000  # the edited region, so the answer fits in about 1,024 tokens

SUFFIXES = ("value", "data", "item", "info", "state", "entry")
PARAMETERS = (("timeout", "None"), ("verbose", "False"), ("strict", "True"), ("limit", "None"), ("retries", "3"))
PYTHON_RESERVED = {*keyword.kwlist, *keyword.softkwlist, *dir(builtins), "self", "cls"}
C_FAMILY_RESERVED = set(
    """auto break case char const continue default do double else enum extern float for goto if inline int long
    register return short signed sizeof static struct switch typedef union unsigned void volatile while bool
    size_t NULL true false class delete new this throw try catch public private protected template typename
    namespace using virtual function var let async await yield typeof instanceof undefined null export import
    require module exports console Object Array String Number Promise Error JSON Math Symbol Map Set func
    package type interface string error nil make len append range go defer chan select map""".split()
)
DECLARED = re.compile(
    r"\b(?:const|let|var|int|char|long|short|unsigned|double|float|bool|size_t|void|struct\s+\w+|\w+_t)"
    r"\s*\**\s*([A-Za-z_]\w*)\s*[=;,\[)]"
)


@dataclass(frozen=True)
class Edit:
    """One edit: its kind, what the user asks, and the region after it."""

    kind: str
    instruction: str
    text: str


def words(text: str, name: str) -> int:
    """How often `name` occurs in `text` as a whole word. Example: words("a ab a", "a") -> 2."""
    return len(re.findall(rf"(?<![\w$]){re.escape(name)}(?![\w$])", text))


def replace_word(text: str, old: str, new: str) -> str:
    """Every whole-word `old` -> `new`."""
    return re.sub(rf"(?<![\w$]){re.escape(old)}(?![\w$])", lambda _: new, text)


# ---- rename ----------------------------------------------------------------------------------


def rename_candidates(region: Region, language: str) -> list[str]:
    """Names the region defines (Python: with ast; else block names and declarations), 3+ letters,
    no keyword, builtin or dunder, used at least 3 times."""
    if language == "python":
        names, reserved = set(defined_names(region.text)), PYTHON_RESERVED
    else:
        names = {u.name for u in region.units if u.name} | set(DECLARED.findall(region.text))
        reserved = C_FAMILY_RESERVED
    return sorted(
        n for n in names if len(n) >= 3 and n not in reserved and not n.startswith("__") and words(region.text, n) >= 3
    )


def new_name(old: str, language: str, rng: random.Random, text: str) -> str | None:
    """A new name in the old one's style, not yet used in the text: parse_header ->
    parse_header_value, MAX_SIZE -> MAX_SIZE_DATA, readFile -> readFileInfo."""
    for suffix in rng.sample(SUFFIXES, len(SUFFIXES)):
        if old.isupper():
            new = f"{old}_{suffix.upper()}"
        elif "_" not in old.strip("_") and (re.search(r"[a-z][A-Z]", old) or language in ("javascript", "go")):
            new = old + suffix.capitalize()
        else:
            new = f"{old}_{suffix}"
        if words(text, new) == 0:
            return new
    return None


def rename(region: Region, language: str, rng: random.Random) -> Edit | None:
    """Rename an identifier used 3+ times everywhere in the region."""
    candidates = rename_candidates(region, language)
    if not candidates:
        return None
    old = rng.choice(candidates)
    new = new_name(old, language, rng, region.text)
    if new is None:
        return None
    instruction = f"Rename `{old}` to `{new}` everywhere in the file."
    return Edit("rename", instruction, replace_word(region.text, old, new))


# ---- add_parameter ---------------------------------------------------------------------------


def closing_paren(text: str, open_at: int) -> int | None:
    """The index of the ")" that closes the "(" at `open_at`, quotes skipped; None if a comment
    is inside (the signature is left alone then)."""
    depth, quote, i = 0, "", open_at
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c == "#":
            return None
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def insert_parameter(text: str, node: ast.FunctionDef | ast.AsyncFunctionDef, param: str) -> str | None:
    """The text with `param` ("timeout=None") last in the function's parameter list."""
    lines = text.split("\n")
    start = sum(len(s) + 1 for s in lines[: node.lineno - 1])
    match = re.compile(rf"def\s+{re.escape(node.name)}\s*\(").search(text, start)
    if match is None:
        return None
    close = closing_paren(text, match.end() - 1)
    if close is None:
        return None
    inner = text[match.end() : close]
    if not inner.strip():
        return text[:close] + param + text[close:]
    line_start = text.rfind("\n", 0, close) + 1
    if not text[line_start:close].strip() and inner.rstrip().endswith(","):
        previous = text[: line_start - 1].rsplit("\n", 1)[-1]  # a parameter a line, with a trailing comma
        return text[:line_start] + indentation(previous) + param + ",\n" + text[line_start:]
    end = match.end() + len(inner.rstrip())
    separator = " " if inner.rstrip().endswith(",") else ", "
    return text[:end] + separator + param + text[end:]


def add_parameter(region: Region, language: str, rng: random.Random) -> Edit | None:
    """Add a keyword parameter with a default to one function (Python, no **kwargs)."""
    if language != "python":
        return None
    functions = [n for n in ast.walk(ast.parse(region.text)) if isinstance(n, FUNCTIONS)]
    names = Counter(n.name for n in functions)
    fit = sorted((n for n in functions if n.args.kwarg is None and names[n.name] == 1), key=lambda n: n.lineno)
    params = [(p, d) for p, d in PARAMETERS if words(region.text, p) == 0]
    if not fit or not params:
        return None
    node, (param, default) = rng.choice(fit), rng.choice(params)
    text = insert_parameter(region.text, node, f"{param}={default}")
    if text is None or not signature_has(text, node.name, param):
        return None
    instruction = (
        f"Add a keyword parameter `{param}` with the default `{default}` to `{node.name}`, after its other "
        "parameters; leave its body as it is."
    )
    return Edit("add_parameter", instruction, text)


def signature_has(text: str, name: str, param: str) -> bool:
    """The text parses and the function `name` takes a parameter `param`."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, FUNCTIONS) and node.name == name:
            args = node.args
            return param in [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    return False


# ---- add_docstrings --------------------------------------------------------------------------


def docstring_for(name: str) -> str:
    """A one-line docstring made from a function's name: parse_header -> "Parse header.",
    readHTTPLine -> "Read http line.", __init__ -> "Init."."""
    parts = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", name)
    if not parts:
        return "Do the work."
    sentence = " ".join(p.lower() for p in parts)
    return sentence[0].upper() + sentence[1:] + "."


def body_line(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int | None:
    """The 0-based line a docstring goes on (where the body starts), or None if the body starts
    on the signature's line."""
    first = node.body[0]
    line = min([first.lineno, *(d.lineno for d in decorators(first))]) - 1
    col = first.col_offset if line == first.lineno - 1 else len(indentation(lines[line]).encode())
    head = lines[line].encode()[:col].decode("utf-8", errors="replace")
    return line if not head.strip() else None


def add_docstrings(region: Region, language: str, rng: random.Random) -> Edit | None:
    """Give every function without a docstring `\"\"\"<Name words>.\"\"\"` (Python)."""
    if language != "python":
        return None
    lines = region.text.split("\n")
    functions = [n for n in ast.walk(ast.parse(region.text)) if isinstance(n, FUNCTIONS)]
    missing = sorted((n for n in functions if ast.get_docstring(n, clean=False) is None), key=lambda n: n.lineno)
    if not missing:
        return None
    inserts = []
    for node in missing:
        line = body_line(node, lines)
        if line is None:
            return None
        inserts.append((line, indentation(lines[line]) + f'"""{docstring_for(node.name)}"""'))
    for line, docstring in sorted(inserts, reverse=True):
        lines.insert(line, docstring)
    example = missing[0].name
    instruction = (
        "Give every function that has no docstring a one-line docstring made from its name, such as "
        f'`"""{docstring_for(example)}"""` for `{example}`; leave the rest of the code as it is.'
    )
    return Edit("add_docstrings", instruction, "\n".join(lines))


# ---- reorder ---------------------------------------------------------------------------------


def reorder(region: Region, language: str, rng: random.Random) -> Edit | None:
    """Swap two named definitions of the region."""
    named = [u for u in region.units if u.name and u.kind != "other"]
    counts = Counter(u.name for u in named)
    named = [u for u in named if counts[u.name] == 1]
    if len(named) < 2:
        return None
    a, b = sorted(rng.sample(named, 2), key=lambda u: u.start)
    lines = region.text.split("\n")
    swapped = (
        lines[: a.start]
        + lines[b.start : b.end + 1]
        + lines[a.end + 1 : b.start]
        + lines[a.start : a.end + 1]
        + lines[b.end + 1 :]
    )
    instruction = (
        f"Swap the definitions of `{a.name}` and `{b.name}`: put `{b.name}` where `{a.name}` is now and "
        f"`{a.name}` where `{b.name}` is; change nothing else."
    )
    return Edit("reorder", instruction, "\n".join(swapped))


# ---- change_line -----------------------------------------------------------------------------

NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.])")
COMPARISON = re.compile(r"(?<![<>=!])(===|!==|==|!=|<=|>=)(?!=)")
FLIPPED = {"===": "!==", "!==": "===", "==": "!=", "!=": "==", "<=": "<", ">=": ">"}
STRING = re.compile(r"(?<![\"'])([\"'])([A-Za-z][a-z]+(?: [A-Za-z0-9,.:]+){0,6})\1(?![\"'])")
QUOTED = re.compile(r"\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'")


def code_spans(line: str, language: str) -> tuple[list[tuple[int, int]], int]:
    """The line's quoted spans and where its code ends (a trailing comment starts)."""
    quoted = [m.span() for m in QUOTED.finditer(line)]
    marker = "#" if language == "python" else "//"
    end = len(line)
    for i in [m.start() for m in re.finditer(re.escape(marker), line)]:
        if not any(a <= i < b for a, b in quoted):
            end = i
            break
    return quoted, end


def line_changes(line: str, language: str) -> list[tuple[str, str, str]]:
    """(old token, new token, new line) for each change one line offers: a number +1, a
    comparison flipped, a short string's first letter in the other case."""
    quoted, end = code_spans(line, language)
    outside = [(m, str(int(m.group()) + 1)) for m in NUMBER.finditer(line) if not m.group().startswith("0")]
    outside += [(m, FLIPPED[m.group()]) for m in COMPARISON.finditer(line)]
    out = []
    for match, new in outside:
        a, b = match.span()
        if b <= end and not any(x <= a < y for x, y in quoted) and line.count(match.group()) == 1:
            out.append((match.group(), new, line[:a] + new + line[b:]))
    for match in STRING.finditer(line[:end]):
        old, body = match.group(), match.group(2)
        new = match.group(1) + body[0].swapcase() + body[1:] + match.group(1)
        if line.count(old) == 1:
            a, b = match.span()
            out.append((old, new, line[:a] + new + line[b:]))
    return out


def string_lines(text: str, language: str) -> set[int]:
    """0-based lines inside a Python multi-line string (docstrings): not code to change."""
    if language != "python":
        return set()
    out: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.end_lineno > node.lineno:
            out.update(range(node.lineno - 1, node.end_lineno))
    return out


def change_line(region: Region, language: str, rng: random.Random) -> Edit | None:
    """Change one literal or comparison on a line that occurs once in a region of 100+ lines."""
    if region.num_lines < LONG_LIMITS.min_lines:
        return None
    lines = region.text.split("\n")
    counts = Counter(s.strip() for s in lines)
    skip = string_lines(region.text, language)
    comment = ("#",) if language == "python" else ("//", "/*", "*")
    options = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if i in skip or counts[stripped] != 1 or "`" in line or not stripped or stripped.startswith(comment):
            continue
        options.extend((i, *change) for change in line_changes(line, language))
    if not options:
        return None
    i, old, new, changed = rng.choice(options)
    instruction = f"In the line `{lines[i].strip()}`, change `{old}` to `{new}`."
    return Edit("change_line", instruction, "\n".join([*lines[:i], changed, *lines[i + 1 :]]))


EDITS: dict[str, Callable[[Region, str, random.Random], Edit | None]] = {
    "rename": rename,
    "add_parameter": add_parameter,
    "add_docstrings": add_docstrings,
    "reorder": reorder,
    "change_line": change_line,
}


def limits_for(kind: str) -> Limits:
    """The region size an edit kind needs: change_line a long one."""
    return LONG_LIMITS if kind == "change_line" else EDIT_LIMITS


def edit_kinds_for(language: str) -> tuple[str, ...]:
    """The edit kinds a language allows: the Python-only ones need ast."""
    return EDIT_KINDS if language == "python" else tuple(k for k in EDIT_KINDS if k not in PYTHON_ONLY)
