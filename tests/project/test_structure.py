"""Structural rules read from the source (nothing imported): what torchmagic remembers about
the user's objects lives in one registry, and no comment or test points to an issue tracker
the repository does not have."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import torchmagic

PACKAGE = Path(torchmagic.__file__).parent
ROOT = PACKAGE.parents[1]
WEAK_MAPS = {"WeakKeyDictionary", "WeakValueDictionary", "WeakSet"}
# The one registry of user objects: its module and the name of its one instance.
REGISTRY = ("core/registry.py", "REGISTRY")
# Module-level weak maps keyed by torchmagic's own objects, not the user's, and why.
OWN_OBJECTS = {
    ("render/base.py", "_MEASURED"): "a drawing cache keyed by the render layer's own consoles",
}
# Keys a module-level dict may be annotated with without being keyed by objects.
PLAIN_KEYS = {"str", "int", "float", "bool", "bytes", "type", "tuple"}
TRACKER = re.compile(r"\bissues?\s*#?\d", re.IGNORECASE)  # the word, maybe "#", a number


def _name(node: ast.expr) -> str:
    """The last name of ``a.b.C`` / ``C`` / ``C[...]``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _keyed_by_objects(annotation: ast.expr | None) -> bool:
    """``dict[K, V]`` (or a mapping of that kind) whose key K is not a plain value."""
    if not isinstance(annotation, ast.Subscript) or _name(annotation.value) not in {
        "dict",
        "Dict",
        "defaultdict",
        "OrderedDict",
        "MutableMapping",
    }:
        return False
    index = annotation.slice
    key = index.elts[0] if isinstance(index, ast.Tuple) else index
    return _name(key) not in PLAIN_KEYS


def _is_registry(value: ast.expr | None, annotation: ast.expr | None) -> bool:
    constructed = _name(value.func) if isinstance(value, ast.Call) else ""
    return (
        constructed in WEAK_MAPS
        or constructed == "Registry"
        or (annotation is not None and _name(annotation) in WEAK_MAPS)
        or _keyed_by_objects(annotation)
    )


def module_registries(source: str) -> list[str]:
    """The names of ``source``'s module-level maps of objects: weak maps, ``Registry``
    instances, dicts annotated with keys that are objects."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            targets, value, annotation = node.targets, node.value, None
        elif isinstance(node, ast.AnnAssign):
            targets, value, annotation = [node.target], node.value, node.annotation
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and _is_registry(value, annotation):
                found.append(target.id)
    return found


def _registries() -> set[tuple[str, str]]:
    return {
        (path.relative_to(PACKAGE).as_posix(), name)
        for path in PACKAGE.rglob("*.py")
        for name in module_registries(path.read_text())
    }


def test_the_rule_sees_each_kind_of_module_level_map():
    source = """
import weakref
from weakref import WeakKeyDictionary
A = weakref.WeakKeyDictionary()
B: WeakKeyDictionary[object, int] = WeakKeyDictionary()
C = weakref.WeakSet()
D: dict[nn.Module, int] = {}
E = Registry()
F: dict[str, int] = {}
G = {}
def f():
    H = weakref.WeakKeyDictionary()
class K:
    I = weakref.WeakKeyDictionary()
"""
    assert module_registries(source) == ["A", "B", "C", "D", "E"]


def test_at_most_one_module_level_registry_of_user_objects():
    user = _registries() - OWN_OBJECTS.keys()
    assert user == {REGISTRY}, (
        "what torchmagic remembers about the user's objects goes on the object or into a "
        f"documented field of core/registry.py's Registry, not a map of its own: {sorted(user)}"
    )


def test_no_reference_to_an_issue_tracker_in_src_or_tests():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for top in ("src", "tests")
        for path in sorted((ROOT / top).rglob("*"))
        if path.is_file() and path.suffix in {".py", ".md", ".txt", ".json", ".ipynb", ".toml"}
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if TRACKER.search(line)
    ]
    assert not found, "say why in words, not by an issue number:\n" + "\n".join(found)
