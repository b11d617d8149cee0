"""extension.json must describe exactly the registered magics, their parsers and config."""

import argparse
import json
from pathlib import Path

import pytest

import torchmagic
from torchmagic.magics import KEY_OPTIONS, TorchMagics
from torchmagic.manifest import load_manifest

ROOT = Path(__file__).resolve().parents[1]


def _parser_arguments(func) -> list[dict]:
    out = []
    for action in func.parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        positional = not action.option_strings
        flag = isinstance(action, argparse._StoreTrueAction)
        out.append(
            {
                "name": action.dest if positional else max(action.option_strings, key=len),
                "dest": action.dest,
                "kind": "positional" if positional else ("flag" if flag else "option"),
                "nargs": action.nargs if not flag else None,
                "choices": list(action.choices) if action.choices else None,
                "default": action.default,
                "type": {None: "bool" if flag else "str", int: "int", float: "float"}.get(
                    action.type, getattr(action.type, "__name__", "?")
                ),
                "help": action.help,
            }
        )
    return out


def _manifest_arguments(magic: dict) -> list[dict]:
    return [
        {
            "name": a["name"],
            "dest": a.get("dest", a["name"]),
            "kind": a["kind"],
            "nargs": a.get("nargs"),
            "choices": a.get("choices"),
            "default": a["default"],
            "type": a["type"],
            "help": a["help"],
        }
        for a in magic["arguments"]
    ]


def test_package_copy_is_the_repository_file():
    assert load_manifest() == json.loads((ROOT / "extension.json").read_text())


def test_header():
    manifest = load_manifest()
    assert manifest["name"] == "torchmagic" and manifest["version"] == torchmagic.__version__
    assert manifest["load"] == "%load_ext torchmagic"


def test_every_registered_magic_is_described_and_vice_versa():
    registered = set(TorchMagics.magics["line"]) | {f"%%{n}" for n in TorchMagics.magics["cell"]}
    described = {
        m["name"] if m["kind"] == "line" else f"%%{m['name']}" for m in load_manifest()["magics"]
    }
    assert registered == described


@pytest.mark.parametrize("magic", load_manifest()["magics"], ids=lambda m: m["name"])
def test_arguments_match_the_parser(magic):
    func = getattr(TorchMagics, TorchMagics.magics[magic["kind"]][magic["name"]])
    prefix = "%%" if magic["kind"] == "cell" else "%"
    assert _manifest_arguments(magic) == _parser_arguments(func)
    keys = [kv["name"] for kv in magic["key_values"]]
    assert tuple(keys) == KEY_OPTIONS.get(magic["name"], ())
    assert magic["example"].startswith(f"{prefix}{magic['name']}")
    assert magic["usage"].startswith(f"{prefix}{magic['name']}")


def test_config_matches_the_traits():
    traits = TorchMagics.class_traits(config=True)
    described = {c["name"]: c for c in load_manifest()["config"]}
    assert set(described) == set(traits)
    for name, trait in traits.items():
        assert described[name]["default"] == trait.default_value, name
        if hasattr(trait, "values"):
            assert described[name]["choices"] == list(trait.values), name
