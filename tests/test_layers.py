"""The `loop` modules import one another without a cycle, and the worker's floors are one-way.

The import graph is read from the source with `ast`: every `import` and `from … import` in
loop/**/*.py, at module level and inside functions alike (an import that dodges a cycle by
waiting inside a function is a cycle all the same), except those under `if TYPE_CHECKING:`,
which never run. Relative imports are resolved to module names; `from . import x` where `x` is
a submodule imports that submodule, and importing a package imports its `__init__`.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "loop"

# The worker's floors, top to bottom: a module of a floor may import modules of the floors
# below it, never of one above. A name is a module or a package (with every module in it).
# Only floors that exist are checked (loop.worker and loop.step_life are to come).
FLOORS = [
    "loop.worker",
    "loop.notify",
    "loop.step_life",
    "loop.judges",
    "loop.effects",
    "loop.mcp",
    "loop.tools",
]


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def is_package(name: str, known: dict[str, Path]) -> bool:
    return known[name].name == "__init__.py"


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in the tree, wherever it stands, but none under
    `if TYPE_CHECKING:` (its `else:` branch runs, and counts)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _ancestors(name: str) -> set[str]:
    return {".".join(name.split(".")[:n]) for n in range(1, name.count(".") + 1)}


def _with_parents(target: str, importer: str) -> set[str]:
    """`target` and the packages Python imports on the way to it, except those the importer
    sits in (they are being imported already when it runs)."""
    parts = target.split(".")
    on_the_way = {".".join(parts[:n]) for n in range(1, len(parts))}
    return {target} | (on_the_way - _ancestors(importer))


def imported_by(name: str, known: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports."""
    tree = ast.parse(known[name].read_text(), filename=str(known[name]))
    here = name if is_package(name, known) else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                targets |= _with_parents(alias.name, name)
            continue
        if node.level:
            base = here.split(".")
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        submodules = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in known]
        # `from . import sibling` in a package's module needs nothing of the package's
        # __init__ (it is being imported already); `from . import Name` does.
        if len(submodules) < len(node.names) or source not in _ancestors(name):
            targets |= _with_parents(source, name)
        for submodule in submodules:
            targets |= _with_parents(submodule, name)
    return {t for t in targets if t in known and t != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported_by(name, known) for name in known}


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def a_cycle(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module, as a path back to it."""
    start = component[0]
    members = set(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"no cycle through {start}")


def cycles(edges: dict[str, set[str]]) -> list[str]:
    """Each set of modules that import one another in a circle: a shortest such circle, then
    what each of them imports inside the set."""
    found = []
    for component in strongly_connected(edges):
        if len(component) > 1:
            inside = "; ".join(
                f"{name} -> {', '.join(sorted(edges[name] & set(component)))}" for name in component
            )
            found.append(f"{' -> '.join(a_cycle(component, edges))}  [{inside}]")
    return found


def floor_of(name: str, floors: list[str]) -> int | None:
    for level, floor in enumerate(floors):
        if name == floor or name.startswith(floor + "."):
            return level
    return None


# ---- the reader itself, on a package made for it --------------------------------------------


def test_the_reader_resolves_imports_as_python_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / PACKAGE
    (package / "tools").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from . import b\nfrom .tools import mail\n",
        "b.py": "def f():\n    from .c import thing\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n",
        "d.py": "import loop.a\n",
        "tools/__init__.py": "",
        "tools/mail.py": "from .. import d\nfrom . import helper_name\n",
    }
    for path, text in files.items():
        (package / path).write_text(text)
    monkeypatch.setattr(__name__ + ".ROOT", tmp_path)
    edges = graph()
    assert edges == {
        "loop": set(),
        "loop.a": {"loop.b", "loop.tools", "loop.tools.mail"},
        "loop.b": {"loop.c"},
        "loop.c": set(),  # under TYPE_CHECKING only
        "loop.d": {"loop.a"},
        "loop.tools": set(),
        "loop.tools.mail": {"loop.d", "loop.tools"},  # helper_name is the package's
    }
    assert cycles(edges) == [
        "loop.a -> loop.tools.mail -> loop.d -> loop.a  "
        "[loop.a -> loop.tools.mail; loop.d -> loop.a; loop.tools.mail -> loop.d]"
    ]


# ---- the loop ----------------------------------------------------------------------------


def test_no_import_cycle_among_the_loop_modules() -> None:
    found = cycles(graph())
    assert not found, "import cycles among the loop modules:\n" + "\n".join(found)


def test_the_worker_floors_are_one_way() -> None:
    known = modules()
    floors = [f for f in FLOORS if f in known]
    assert {"loop.judges", "loop.effects", "loop.tools"} <= set(floors), floors
    edges = graph()
    upward = []
    for name, targets in sorted(edges.items()):
        level = floor_of(name, floors)
        if level is None:
            continue
        for target in sorted(targets):
            above = floor_of(target, floors)
            if above is not None and above < level:
                upward.append(f"{name} (floor {floors[level]}) imports {target}")
    assert not upward, "a lower floor imports a higher one:\n" + "\n".join(upward)
