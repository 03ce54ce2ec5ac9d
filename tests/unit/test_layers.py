"""The import rules of docs/design.md section 2: no circle between modules, and no import up the layers.

Every module under src/draftwise is parsed (not imported) and every `import` / `from` of a
draftwise module counts, function-level ones and those under `if TYPE_CHECKING:` included: a
type-only import still ties the two modules together (a circle of them is a circle of ideas,
and one `from __future__` removed makes it run). A package's __init__ is the package itself.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).parents[2] / "src" / "draftwise"

# Bottom first; a module may import from its own layer or a lower one. A name covers the module
# and, for a package, everything in it. A name that matches no file is fine (a module planned
# or gone); a module no name covers fails the test until it is placed.
LAYERS: dict[str, int] = {
    # 0: the data contract and the error types
    "errors": 0,
    "types": 0,
    "constraint": 0,
    # 1: pure functions over that data, and leaves with no model behind them
    "sampling": 1,
    "verify": 1,
    "metrics": 1,
    "models": 1,
    "constraints": 1,
    "gguf_header": 1,
    "compute_thread": 1,  # runs a function on a thread that ends with it (llama.cpp's OpenMP teams)
    # 2: the seams' implementations; calibrate times a Backend, and the auto policy reads it
    "backends": 2,
    "drafters": 2,
    "policy": 2,
    "calibrate": 2,
    "fim": 2,
    "tools": 2,
    "pairing": 2,  # --draft auto: prices the user's models as drafts (stores, calibrate, policy)
    "model_facts": 2,  # reads a GGUF's header: its chat template's family (backends), FIM texts, tool format
    "stores": 2,
    # 3: one request's state, one step over a batch of them, and the slot pool requests run in
    "step": 3,
    "request": 3,
    "slots": 3,
    # 4: the loop over slots that calls the step (a request alone is a batch of one)
    "batching": 4,
    # 5: the engine: generate() and stream() over that loop
    "engine": 5,
    # 6: what loads models and drafters into an engine
    "loading": 6,
    # 7: clients of the public API
    "server": 7,
    "bench": 7,
    "cli": 7,
}


def module_name(root: Path, path: Path) -> str:
    """'draftwise.policy.auto' for policy/auto.py; 'draftwise.policy' for policy/__init__.py."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_name(root, p): p for p in sorted(root.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str], package: str) -> list[tuple[str, int]]:
    """(imported draftwise module, line) for every import in the file, resolved to a module:
    `from draftwise.server import errors` is draftwise.server.errors, `from draftwise.types
    import X` draftwise.types, `import draftwise.backends.base` draftwise.backends.base. An
    import of a module that does not exist is kept as written (a stale function-level import
    fails only when it runs)."""
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package upwards
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # A name from a module is that module; from a package, its submodule if there is one;
            # from the top package, which has no __init__, it can only be a module.
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known or base == package else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            if not target.startswith(package + "."):
                continue
            module = target
            while module not in known and "." in module:  # `import draftwise.x.Y`: the module x
                module = module.rsplit(".", 1)[0]
            module = module if module in known else target
            if module != name and (module, node.lineno) not in out:
                out.append((module, node.lineno))
    return sorted(out, key=lambda edge: (edge[1], edge[0]))


def graph(root: Path) -> dict[str, list[tuple[str, int]]]:
    found = modules(root)
    return {name: imports(name, path, set(found), root.name) for name, path in found.items()}


def layer(name: str, layers: dict[str, int]) -> int | None:
    parts = name.split(".")[1:]  # without the top package
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in layers:
            return layers[key]
    return None


def cycles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The import circles: every strongly connected component of more than one module (Tarjan),
    each as a closed path through it, e.g. ['a', 'b', 'a']."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [_path_through(sorted(c), edges) for c in components]


def _path_through(component: list[str], edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """A shortest circle from the component's first module back to it (breadth first)."""
    inside, start = set(component), component[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w, _ in edges.get(v, ()):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if w in inside and w not in came_from:
                    came_from[w] = v
                    following.append(w)
        frontier = following
    return [*component, start]


def violations(root: Path, layers: dict[str, int]) -> list[str]:
    """One line per broken rule: unplaced modules, upward imports, circles."""
    paths, edges = modules(root), graph(root)
    problems = [
        f"{name}: in no layer; place it in LAYERS (tests/unit/test_layers.py)"
        for name in edges
        if name != root.name and layer(name, layers) is None
    ]
    for name, targets in edges.items():
        own, rel = layer(name, layers), paths[name].relative_to(root.parent)
        for target, line in targets:
            theirs = layer(target, layers)
            if target not in paths:
                problems.append(f"{rel}:{line}: {name} imports {target}, which does not exist")
            elif own is not None and theirs is not None and theirs > own:
                problems.append(f"{rel}:{line}: {name} (layer {own}) imports {target} (layer {theirs}), above it")
    for circle in cycles(edges):
        problems.append("import circle: " + " -> ".join(circle))
    return problems


# ---------------------------------------------------------------------- the rule on draftwise
def test_no_circle_and_no_upward_import():
    problems = violations(SRC, LAYERS)
    assert not problems, "\n".join(problems)


def test_the_walk_sees_the_imports_it_judges():
    edges = {name: {t for t, _ in targets} for name, targets in graph(SRC).items()}
    assert "draftwise.errors" in edges["draftwise.types"]
    assert "draftwise.policy.base" in edges["draftwise.policy.auto"]
    # a function-level import (`from draftwise.policy.auto import MAX_K` inside a command)
    assert any(t.startswith("draftwise.policy") for n, ts in edges.items() if n.startswith("draftwise.cli") for t in ts)
    assert not edges["draftwise.errors"], "errors.py must stay a leaf"
    assert "draftwise.constraints" in edges["draftwise.drafters.prediction"]  # only under TYPE_CHECKING
    assert "draftwise.slots" in edges["draftwise.batching"] and "draftwise.engine" not in edges["draftwise.batching"]


# ---------------------------------------------------------------------- the checker itself
def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


TOY_LAYERS = {"low": 0, "mid": 1, "sub": 1, "high": 2}


def test_checker_finds_an_upward_import_inside_a_function(tmp_path):
    root = write(tmp_path, {"low.py": "def f():\n    from pkg.high import g\n", "high.py": "import pkg.low\n"})
    problems = violations(root, TOY_LAYERS)
    assert any("pkg/low.py:2" in p and "imports pkg.high (layer 2)" in p for p in problems), problems
    assert any("circle" in p for p in problems), problems


def test_checker_counts_type_checking_imports(tmp_path):
    root = write(
        tmp_path,
        {
            "low.py": """\
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from pkg.high import g
            else:
                from pkg.mid import h
            """,
            "mid.py": "",
            "high.py": "from pkg import low\n",
        },
    )
    problems = violations(root, TOY_LAYERS)
    assert problems == [
        "pkg/low.py:3: pkg.low (layer 0) imports pkg.high (layer 2), above it",
        "pkg/low.py:5: pkg.low (layer 0) imports pkg.mid (layer 1), above it",
        "import circle: pkg.high -> pkg.low -> pkg.high",
    ], problems


def test_checker_treats_a_package_init_as_the_package(tmp_path):
    root = write(
        tmp_path,
        {
            "sub/__init__.py": "from pkg.sub.a import x\n",
            "sub/a.py": "from pkg.sub.b import y\n",
            "sub/b.py": "from pkg.sub import x\n",  # back to the package: a circle through __init__
            "low.py": "",
            "mid.py": "from . import low\n",
        },
    )
    problems = violations(root, TOY_LAYERS)
    assert problems == ["import circle: pkg.sub -> pkg.sub.a -> pkg.sub.b -> pkg.sub"], problems
    assert {t for t, _ in graph(root)["pkg.mid"]} == {"pkg.low"}  # `from . import low`: the module


def test_checker_finds_an_import_of_a_missing_module(tmp_path):
    root = write(
        tmp_path, {"low.py": "", "mid.py": "def f():\n    from pkg.gone import g\n    from pkg import low, lost\n"}
    )
    assert violations(root, TOY_LAYERS) == [
        "pkg/mid.py:2: pkg.mid imports pkg.gone, which does not exist",
        "pkg/mid.py:3: pkg.mid imports pkg.lost, which does not exist",
    ]


def test_checker_asks_to_place_an_unknown_module(tmp_path):
    root = write(tmp_path, {"low.py": "", "stray.py": "import pkg.low\n"})
    assert violations(root, TOY_LAYERS) == ["pkg.stray: in no layer; place it in LAYERS (tests/unit/test_layers.py)"]


@pytest.mark.parametrize(
    "name, expected",
    [("draftwise.policy.auto", 2), ("draftwise.server", 7), ("draftwise.types", 0), ("draftwise.nowhere", None)],
)
def test_layer_of_a_module(name, expected):
    assert layer(name, LAYERS) == expected
