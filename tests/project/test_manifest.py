"""extension.json is generated from the magics (tools/gen_manifest.py): the committed file
must be what the tool writes, describe exactly the registered magics, and be what usage
errors read."""

import importlib.util
import json
from types import ModuleType

import torchmagic
from paths import ROOT
from torchmagic.magics import TOPICS, TorchMagics
from torchmagic.magics.base import TopicMagics
from torchmagic.manifest import load_manifest


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
            entries = [*table.entries, *([table.other] if table.other else [])]
            for entry in entries:
                assert getattr(topic, entry.handler.__name__, None) is entry.handler, method


def test_config_matches_the_traits():
    traits = TorchMagics.class_traits(config=True)
    described = {c["name"]: c for c in load_manifest()["config"]}
    assert set(described) == set(traits)
    for name, trait in traits.items():
        assert described[name]["default"] == trait.default_value, name
