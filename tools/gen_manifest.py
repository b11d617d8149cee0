"""Write extension.json from the magics themselves: their argparse parsers, ``key=value``
options and subcommand tables, their docstrings (summaries), the ``TorchMagics`` traitlets
(config) and ``torchmagic.__version__``. The only hand-kept text is the small table below.

    python tools/gen_manifest.py          # rewrite extension.json
    python tools/gen_manifest.py --check  # exit 1 when extension.json is out of date

tests/test_manifest.py fails when the committed file differs from what this writes.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "extension.json"
sys.path.insert(0, str(ROOT / "src"))  # describe this tree's code, not an installed copy

import torchmagic  # noqa: E402
from torchmagic.core.training.amp import MODES  # noqa: E402
from torchmagic.magics import TOPICS, TorchMagics  # noqa: E402
from torchmagic.magics.base import Subcommand, Subcommands  # noqa: E402

DESCRIPTION = (
    "IPython magics for interactive transfer learning with PyTorch: freeze, unfreeze, "
    "replace heads, keep optimizer, schedulers and BatchNorm consistent, undo."
)
EXAMPLES = {
    ("freeze", "line"): "%freeze model.layer1-3",
    ("unfreeze", "line"): "%unfreeze layer3-4 lr=1e-5:1e-4",
    ("replace_head", "line"): "%replace_head auto 10",
    ("lora", "line"): "%lora \"blocks.*.attn.qkv\" r=8 lr=1e-3",
    ("summary", "line"): "%summary model --depth 1 --input-shape 1,3,224,224",
    ("amp", "line"): "%amp on bf16",
    ("amp", "cell"): "%%amp bf16",
    ("fit", "line"): "%fit train_loader --val val_loader --epochs 9 --unfreeze layer4,layer3",
    ("device", "line"): "%device move",
    ("gpumem", "line"): "%gpumem estimate --input-shape 8,3,224,224",
    ("tm", "line"): "%tm undo",
    ("load_model", "line"): "%load_model resnet18 --weights DEFAULT --num-classes 10",
    ("lr_find", "line"): "%lr_find train_loader --apply",
    ("fine_tune", "line"): "%fine_tune train_loader --val val_loader --epochs 3 --lr 1e-3",
    ("evaluate", "line"): "%evaluate model val_loader --worst 16",
    ("predict", "line"): "%predict model photos/ --top 3",
}
# One line each for %tm help's screen: what the magic is for (short: a 60-column
# terminal shows a line each).
PURPOSES = {
    ("freeze", "line"): "stop training modules; the optimizer follows",
    ("unfreeze", "line"): "train modules again, in their own lr groups",
    ("replace_head", "line"): "a fresh classification head with N outputs",
    ("lora", "line"): "LoRA adapters on layers; merge, off, on",
    ("summary", "line"): "the module table, output shapes too",
    ("load_model", "line"): "a zoo model with its weights and labels",
    ("amp", "line"): "mixed precision: status, on, off",
    ("amp", "cell"): "one cell under autocast",
    ("fit", "line"): "train with its schedulers, live progress",
    ("lr_find", "line"): "the lr range test; all restored after",
    ("fine_tune", "line"): "fastai's recipe: the head, then all",
    ("evaluate", "line"): "metrics, confusion, worst samples; compare",
    ("predict", "line"): "classes of new inputs, eval transforms",
    ("device", "line"): "devices; move a model with its state",
    ("gpumem", "line"): "memory now, a step's peak, the best batch",
    ("tm", "line"): "the session: history, undo, save, help",
}
CELL_WORDS = {"amp": f"[{'|'.join(MODES)}]"}  # what follows %%name on a cell's first line
CELL_PREFIX = "Cell:"  # the docstring paragraph that describes the cell magic
TRAIT_TYPES = {"Enum": "str", "Unicode": "str", "Float": "float", "Int": "int", "Bool": "bool"}


def _paragraphs(text: str) -> list[str]:
    return [" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n") if p.strip()]


def summary(func, kind: str) -> str:
    """The docstring's first paragraph; for a cell magic, its ``Cell:`` paragraph."""
    paragraphs = _paragraphs(func.parser.description)
    if kind == "line":
        return paragraphs[0]
    cell = next(p for p in paragraphs if p.startswith(CELL_PREFIX))
    return cell.removeprefix(CELL_PREFIX).strip()


def _actions(func) -> list[argparse.Action]:
    return [a for a in func.parser._actions if not isinstance(a, argparse._HelpAction)]


def _flag(action: argparse.Action) -> bool:
    return isinstance(action, argparse._StoreTrueAction)


def arguments(func) -> list[dict]:
    """Every argument of the magic's parser, as the manifest lists it."""
    out = []
    for action in _actions(func):
        positional = not action.option_strings
        entry: dict = {"name": action.dest if positional else max(action.option_strings, key=len)}
        if not positional:
            entry["dest"] = action.dest
        entry["kind"] = "positional" if positional else ("flag" if _flag(action) else "option")
        entry["type"] = "bool" if _flag(action) else getattr(action.type, "__name__", "str")
        if action.nargs is not None and not _flag(action):
            entry["nargs"] = action.nargs
        if action.choices:
            entry["choices"] = list(action.choices)
        entry["default"] = action.default
        entry["help"] = action.help
        out.append(entry)
    return out


def option_usage(action: argparse.Action, required: bool = False) -> str:
    """``--epochs N``, in brackets unless the parser or the subcommand requires it."""
    option = max(action.option_strings, key=len)
    if _flag(action):
        return f"[{option}]"
    value = "|".join(action.choices) if action.choices else action.metavar or action.dest.upper()
    usage = f"{option} {value}{' ...' if action.nargs == '+' else ''}"
    return usage if action.required or required else f"[{usage}]"


def _positional_usage(action: argparse.Action) -> str:
    metavar = action.metavar or action.dest.upper()
    return f"[{metavar}]" if action.nargs == "?" else metavar


def subcommand_usage(name: str, func, entry: Subcommand) -> str:
    options = {max(a.option_strings, key=len): a for a in _actions(func) if a.option_strings}
    word = entry.name if entry.name != "*" else ""
    given = [option_usage(options[o], o in entry.required) for o in entry.options]
    parts = [f"%{name}", word, entry.words, *given]
    return " ".join(p for p in parts if p)


def line_usage(name: str, func) -> str:
    """``%name`` and its arguments: from the parser, or from the subcommand table."""
    table: Subcommands | None = getattr(func, "subcommands", None)
    if table is None:
        positionals = [_positional_usage(a) for a in _actions(func) if not a.option_strings]
        keys = [f"[{k.usage}]" for k in getattr(func, "key_options", ())]
        options = [option_usage(a) for a in _actions(func) if a.option_strings]
        return " ".join([f"%{name}", *positionals, *keys, *options])
    prefix = f"%{name} "
    named = [e for e in table.entries if e.name]
    if table.other is not None:
        named.insert(0, table.other)
    body = " | ".join(subcommand_usage(name, func, e).removeprefix(prefix) for e in named)
    claimed = {o for e in named for o in e.options}
    rest = [option_usage(a) for a in _actions(func) if a.option_strings]
    rest = [u for u in rest if u.split()[0].strip("[]") not in claimed]
    return " ".join([prefix + (f"[{body}]" if "" in table.by_name else body), *rest])


def describe(name: str, func, kind: str) -> dict:
    table: Subcommands | None = getattr(func, "subcommands", None)
    entry = {
        "name": name,
        "kind": kind,
        "usage": line_usage(name, func) if kind == "line" else f"%%{name} {CELL_WORDS[name]}",
        "summary": summary(func, kind),
        "arguments": arguments(func),
        "key_values": [
            {"name": k.name, "usage": k.usage, "type": k.type, "default": k.default, "help": k.help}
            for k in getattr(func, "key_options", ())
        ],
    }
    if kind == "line" and table is not None:
        entries = [*table.entries, *([table.other] if table.other is not None else [])]
        entry["subcommands"] = [
            {"name": e.name, "usage": subcommand_usage(name, func, e), "help": e.help}
            for e in entries
        ]
    entry["example"] = EXAMPLES[(name, kind)]
    entry["purpose"] = PURPOSES[(name, kind)]
    entry["docs"] = f"{documentation()}#{name}"
    return entry


def documentation() -> str:
    """The magics reference's address, from pyproject.toml's project URLs."""
    found = re.search(r'^Documentation = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert found, "pyproject.toml names no Documentation URL"
    return found.group(1)


def config() -> list[dict]:
    out = []
    for name, trait in TorchMagics.class_traits(config=True).items():
        entry: dict = {"name": name, "type": TRAIT_TYPES[type(trait).__name__]}
        if hasattr(trait, "values"):
            entry["choices"] = list(trait.values)
        entry["default"] = trait.default_value
        entry["help"] = trait.help
        out.append(entry)
    return out


def build_manifest() -> dict:
    magics = []
    for topic in TOPICS:
        for name, method in topic.magics["line"].items():
            func = getattr(topic, method)
            magics.append(describe(name, func, "line"))
            if name in topic.magics["cell"]:
                magics.append(describe(name, func, "cell"))
    return {
        "name": "torchmagic",
        "version": torchmagic.__version__,
        "description": DESCRIPTION,
        "load": "%load_ext torchmagic",
        "unload": "%unload_ext torchmagic",
        "python_api": "torchmagic.Session",
        "documentation": documentation(),
        "config_class": TorchMagics.__name__,
        "config": config(),
        "magics": magics,
    }


def render() -> str:
    return json.dumps(build_manifest(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if MANIFEST.read_text() != text:
            print(f"{MANIFEST.name} is out of date: run python tools/gen_manifest.py")
            return 1
        return 0
    MANIFEST.write_text(text)
    print(f"wrote {MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
