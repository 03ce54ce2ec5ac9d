"""A seam declares what it offers (docs/design.md section 3): a backend's abilities are fields of
its `Capabilities` or members of the Backend protocol, a drafter's optional parts have defaults in
`BaseDrafter`, so a `getattr` / `hasattr` on one of our own objects is a missing declaration.

Those left in src/draftwise read third-party objects (transformers configs, psutil's CPU times, a
starlette route, an `os` constant), a dataclass's fields by name, or an object whose constructor
may have failed part-way; the walk counts them (parsed, not imported) and fails when they grow
past MAX_PROBES, listing each one, so a new probe is a decision, not a drift.
"""

from __future__ import annotations

import ast
import functools
import textwrap
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "draftwise"

MAX_PROBES = 15  # issue 70's bound
PROBES = ("getattr", "hasattr")


@functools.cache  # one walk for the tests below
def probes(root: Path) -> list[str]:
    """'path:line: getattr(...)' for every call of getattr or hasattr in the package's modules.

    Example: a module holding `x = getattr(obj, "n", 0)` on its third line gives
    ['pkg/mod.py:3: getattr(obj, 'n', 0)']."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PROBES:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda p: (p.split(":")[0], int(p.split(":")[1])))


def test_at_most_max_probes_remain():
    found = probes(SRC)
    assert len(found) <= MAX_PROBES, (
        f"{len(found)} getattr/hasattr calls in src/draftwise (at most {MAX_PROBES}): declare the member "
        "on the seam (Drafter and BaseDrafter, Backend and Capabilities) instead of probing for it\n" + "\n".join(found)
    )


def test_the_declared_members_are_read_not_probed():
    """The members issue 70 declared: none of them is asked for by name any more."""
    declared = ("acceptance_prior", "catch_up", "backend", "n_threads", "capabilities", "target", "max_tokens")
    asked = [p for p in probes(SRC) if any(f"'{name}'" in p for name in declared)]
    assert not asked, "\n".join(asked)


def test_the_walk_counts_calls_not_words(tmp_path):
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.py").write_text(
        textwrap.dedent(
            '''\
            """getattr(obj, "x") in a docstring is no call."""
            x = getattr(obj, "n", 0)  # hasattr( in a comment neither
            def f(o):
                return hasattr(o, "m") and o.getattr("y")  # a method of that name is another thing
            '''
        )
    )
    (root / "data.jsonl").write_text('{"text": "getattr(a, b)"}\n')
    assert probes(root) == ["pkg/a.py:2: getattr(obj, 'n', 0)", "pkg/a.py:4: hasattr(o, 'm')"]
