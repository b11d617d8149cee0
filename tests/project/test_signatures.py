"""No function of torchmagic takes more than six positional parameters: a command's
settings travel as one options object, or as keywords (read from the source with ast)."""

from __future__ import annotations

import ast
from pathlib import Path

import torchmagic

PACKAGE = Path(torchmagic.__file__).parent
MAX_POSITIONAL = 6


def _positional(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Parameters that can be passed by position, ``self`` and ``cls`` left out."""
    given = [*node.args.posonlyargs, *node.args.args]
    return [a.arg for a in given if a.arg not in ("self", "cls")]


def _functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}", node))
    return found


def test_no_function_takes_more_than_six_positional_parameters() -> None:
    long = {
        where: len(params)
        for where, node in _functions()
        if len(params := _positional(node)) > MAX_POSITIONAL
    }
    assert not long, f"functions with more than {MAX_POSITIONAL} positional parameters: {long}"


def test_the_count_sees_positional_and_not_keyword_only_parameters() -> None:
    """The rule's own reading: position-only and ordinary parameters count, ``self`` and
    keyword-only ones do not (and the package's sources are read at all)."""
    (node,) = ast.parse("def f(self, a, /, b, *c, d, **e): pass").body
    assert isinstance(node, ast.FunctionDef)
    assert _positional(node) == ["a", "b"]
    names = {where.split(" ")[1] for where, _ in _functions()}
    assert {"freeze", "fit", "push"} <= names
