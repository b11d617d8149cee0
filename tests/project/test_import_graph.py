"""The layers as docs/architecture.md draws them, read from the source (the AST, nothing
imported): no import circle among torchmagic's modules, and the magics reach into the
engine only through what it exports for them."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import torchmagic

PACKAGE = Path(torchmagic.__file__).parent
# What the magics may import from core: the public API (``torchmagic.core``: Session,
# SessionConfig, TorchMagicError, the result classes), the grammar, results, errors,
# advice and the constants exported for them (the one style of numbers, ``short``, through
# ``core.advice``), and the engine half of tab completion.
MAGICS_MAY_IMPORT = {
    "torchmagic.core",
    "torchmagic.core.advice",
    "torchmagic.core.choices",
    "torchmagic.core.completion",
    "torchmagic.core.errors",
    "torchmagic.core.surgery.grammar",
    "torchmagic.core.surgery.results",
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the torchmagic module it imports
    line: int
    typing_only: bool  # under ``if TYPE_CHECKING:``


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """Every torchmagic module ``module`` imports, at any depth (inside functions too).
    ``from pkg import name`` imports the submodule ``pkg.name`` when there is one, else
    ``pkg`` itself."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for statement in child.body:
                    visit_statement(statement, True)
                for statement in child.orelse:
                    visit_statement(statement, typing_only)
            else:
                visit_statement(child, typing_only)

    def visit_statement(node: ast.AST, typing_only: bool) -> None:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.append(submodule if submodule in modules else source)
        for target in targets:
            if target in modules and target != module:
                found.append(Import(module, target, node.lineno, typing_only))
        visit(node, typing_only)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def _graph() -> dict[str, list[Import]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once fully explored
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(edges):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_the_graph_sees_every_kind_of_import():
    """The walk itself: relative and absolute imports, submodules named in a from-import,
    imports inside functions, and typing-only ones told apart."""
    graph = _graph()
    root = {(i.target, i.typing_only) for i in graph["torchmagic"]}
    assert ("torchmagic.core", False) in root and ("torchmagic.magics", False) in root
    base = {(i.target, i.typing_only) for i in graph["torchmagic.magics.base"]}
    assert ("torchmagic.render.spelling", False) in base  # imported inside a method
    assert ("torchmagic.render", True) in base  # under TYPE_CHECKING
    facade = {i.target for i in graph["torchmagic.core.session.facade"]}
    assert {"torchmagic.core.session.undo", "torchmagic.core.advice"} <= facade
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_no_import_circle():
    """Imports under ``if TYPE_CHECKING:`` run only for the type checker and are left out;
    imports inside functions count (a late import is still a dependency)."""
    graph = _graph()
    edges = {m: {i.target for i in found if not i.typing_only} for m, found in graph.items()}
    cycle = _cycle(edges)
    assert cycle is None, "import circle: " + " -> ".join(cycle or ())


def test_the_magics_import_from_core_only_what_it_exports_for_them():
    """Typing-only imports count too: the magics reach engine objects through the
    Session (``session.workspace``, ``session.cell_watch``), never by importing them."""
    graph = _graph()
    magics = [m for m in graph if m.startswith("torchmagic.magics")]
    assert len(magics) > 5
    wrong = [
        f"{i.module} line {i.line}: {i.target}"
        for m in magics
        for i in graph[m]
        if i.target.startswith("torchmagic.core") and i.target not in MAGICS_MAY_IMPORT
    ]
    assert not wrong, "the magics import engine modules not exported for them:\n" + "\n".join(wrong)
