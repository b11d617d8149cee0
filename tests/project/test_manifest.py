"""extension.json and the usage lines of docs/magics.md are generated from the magics'
declarations (tools/gen_manifest.py): the committed files must be what the tool writes,
describe exactly the registered magics, and agree with what ``%name?`` shows."""

import importlib.util
import json
import re
from types import ModuleType

import torchmagic
from paths import ROOT
from torchmagic.magics import TOPICS, TorchMagics
from torchmagic.magics.base import TopicMagics
from torchmagic.manifest import REFERENCE, help_text, load_manifest


def _tool() -> ModuleType:
    """tools/gen_manifest.py, imported by path (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_manifest", ROOT / "tools/gen_manifest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_file_is_what_the_tool_generates():
    committed = (ROOT / "extension.json").read_text()
    assert committed == _tool().render(), (
        "extension.json is out of date: run python tools/gen_manifest.py"
    )


def test_reference_usage_lines_are_what_the_tool_generates():
    committed = (ROOT / "docs/magics.md").read_text()
    assert committed == _tool().reference(committed), (
        "docs/magics.md's usage lines are out of date: run python tools/gen_manifest.py"
    )


def test_every_magic_has_its_usage_line_in_the_reference():
    text = (ROOT / "docs/magics.md").read_text()
    for magic in load_manifest()["magics"]:
        assert f'<a id="{magic["name"]}"></a>\n### ' in text, magic["name"]
        assert f"`{magic['usage']}`" in text, magic["usage"]


def test_question_mark_is_built_from_the_declarations_when_the_class_is():
    """``%fit?`` is the docstring the decorator wrote, before any shell loaded the
    extension: nothing replaces it at run time."""
    for topic in TOPICS:
        for name, method in topic.magics["line"].items():
            doc = getattr(topic, method).__doc__
            assert doc.startswith(f"%{name}") and "::" not in doc, name
            entries = [m for m in load_manifest()["magics"] if m["name"] == name]
            assert doc == "\n\n".join(help_text(m) for m in entries)


def test_the_reference_address_is_the_projects():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^Documentation = "(.+)"$', pyproject, re.M).group(1) == REFERENCE


def test_package_copy_is_the_repository_file():
    assert load_manifest() == json.loads((ROOT / "extension.json").read_text())


def test_header():
    data = load_manifest()
    assert data["name"] == "torchmagic" and data["version"] == torchmagic.__version__
    assert data["load"] == "%load_ext torchmagic" and data["config_class"] == "TorchMagics"


def test_every_registered_magic_is_described_and_vice_versa(ip):
    def ours(kind: str) -> set[str]:
        table = ip.magics_manager.magics[kind]
        return {
            n for n, f in table.items() if isinstance(getattr(f, "__self__", None), TopicMagics)
        }

    registered = ours("line") | {f"%%{n}" for n in ours("cell")}
    described = {
        m["name"] if m["kind"] == "line" else f"%%{m['name']}" for m in load_manifest()["magics"]
    }
    assert registered == described


def test_every_subcommand_has_its_handler():
    for topic in TOPICS:
        for method in topic.magics["line"].values():
            table = getattr(getattr(topic, method), "subcommands", None)
            if table is None:
                continue
            for entry in table.every:
                assert getattr(topic, entry.handler.__name__, None) is entry.handler, method


def test_config_matches_the_traits():
    traits = TorchMagics.class_traits(config=True)
    described = {c["name"]: c for c in load_manifest()["config"]}
    assert set(described) == set(traits)
    for name, trait in traits.items():
        assert described[name]["default"] == trait.default_value, name
