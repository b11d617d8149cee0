"""Tab completion of the magics through IPython's own completer API.

Each case types a line into a fresh shell's completer (``Completer.completions``, what
ipykernel answers a ``complete_request`` with) and checks the candidates: module paths
of the live models, subcommands and option names from the manifest, variables of the
kind each position takes. The engine's candidate functions are tested without IPython.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
from IPython.core.completer import provisionalcompleter
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from completions import complete
from paths import ROOT
from torchmagic.core import completion
from torchmagic.core.workspace import Workspace
from torchmagic.magics.completion import (
    OPTION_VALUES,
    PATH_WORDS,
    POSITIONALS,
    USAGE_WORDS,
    MagicCompleter,
)
from torchmagic.manifest import load_manifest, magic_entry


class Net(nn.Module):
    """resnet's layout in miniature: stem, layer1-4 of two blocks each, fc."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3)
        self.bn1 = nn.BatchNorm2d(4)
        for i in range(1, 5):
            block = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))
            self.add_module(f"layer{i}", nn.Sequential(block, nn.Sequential(nn.Conv2d(4, 4, 1))))
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn1(self.conv1(x))
        for i in range(1, 5):
            x = getattr(self, f"layer{i}")(x)
        return self.fc(x.mean((2, 3)))


def _loader() -> DataLoader:
    data = TensorDataset(torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 0, 1]))
    return DataLoader(data, batch_size=2)


@pytest.fixture
def shell(ip):
    """``ip`` with one model current, a second model, an optimizer, loaders and
    look-alikes of the wrong kind."""
    ip.user_ns.update(
        model=Net(),
        features=nn.Sequential(*(nn.Linear(2, 2) for _ in range(7))),
        train_loader=_loader(),
        train_batches=[(torch.randn(2, 4), torch.tensor([0, 1]))],
        val_loader=_loader(),
        train_size=4,
        train_names=["a", "b"],
        criterion=nn.CrossEntropyLoss(),
    )
    ip.user_ns["opt"] = torch.optim.SGD(ip.user_ns["model"].parameters(), lr=0.1)
    ip.run_line_magic("tm", "use model")
    return ip


# -- module paths ------------------------------------------------------------------


def test_paths_of_the_current_model_replace_ipythons_guesses(shell) -> None:
    layers = ["layer1", "layer2", "layer3", "layer4"]
    assert complete(shell, "%unfreeze lay") == layers
    assert complete(shell, "%freeze la") == layers  # not %%latex
    assert complete(shell, "%summary f") == ["features", "fc"]  # a model, then a child


def test_paths_of_a_named_model(shell) -> None:
    assert complete(shell, "%freeze model.la") == [f"model.layer{i}" for i in range(1, 5)]
    assert complete(shell, "%freeze model.layer2.0.") == ["model.layer2.0.0", "model.layer2.0.1"]
    assert complete(shell, "%replace_head features.") == [f"features.{i}" for i in range(7)]


def test_ranges_complete_after_the_dash(shell) -> None:
    assert complete(shell, "%freeze layer1-") == ["layer1-2", "layer1-3", "layer1-4"]
    assert complete(shell, "%freeze layer2-4") == ["layer2-4"]
    assert complete(shell, "%freeze features.0-") == [f"features.0-{i}" for i in range(1, 7)]
    # through a range, the children its blocks share
    assert complete(shell, "%unfreeze layer1-3.1.") == ["layer1-3.1.0"]


def test_except_completes_paths_of_the_commands_model(shell) -> None:
    assert complete(shell, "%freeze features --except ") == ["features"] + [
        str(i) for i in range(7)
    ]
    assert complete(shell, "%freeze model --except l") == [f"layer{i}" for i in range(1, 5)]
    assert complete(shell, "%freeze --except fc layer1 l")[:1] == ["layer1"]  # nargs=+


def test_unfreeze_offers_its_key_options(shell) -> None:
    assert complete(shell, "%unfreeze layer4 l") == [
        "layer1",
        "layer2",
        "layer3",
        "layer4",
        "lr=",
    ]
    assert complete(shell, "%unfreeze layer4 w") == ["wd="]


def test_a_long_model_is_cut_at_the_limit(shell) -> None:
    shell.user_ns["wide"] = nn.Sequential(*(nn.Linear(1, 1) for _ in range(300)))
    found = complete(shell, "%freeze wide.")
    assert len(found) == completion.LIMIT
    assert found[:3] == ["wide.0", "wide.1", "wide.2"]  # registration order, not 0, 1, 10


def test_no_current_model_offers_the_models(ip) -> None:
    ip.user_ns.update(a=Net(), b=Net())
    assert complete(ip, "%freeze ") == ["a", "b"]


# -- subcommands and options, from the manifest --------------------------------------


def test_subcommands_come_from_the_manifest(shell) -> None:
    for magic in ("tm", "gpumem"):
        names = [s["name"] for s in magic_entry(magic)["subcommands"] if s["name"]]
        assert complete(shell, f"%{magic} ") == names
    assert complete(shell, "%amp o") == ["on", "off"]
    assert complete(shell, "%amp on ") == ["auto", "bf16", "fp16"]
    assert complete(shell, "%%amp b") == ["bf16"]
    assert complete(shell, "%gpumem watch ") == ["on", "off"]
    device = complete(shell, "%device ")
    assert device[:3] == ["move", "check", "pinbench"]
    assert {"cpu", "auto"} <= set(device)


def test_subcommand_arguments_are_variables_of_their_kind(shell) -> None:
    assert complete(shell, "%tm use ") == ["model", "features"]
    assert complete(shell, "%device move m") == ["model"]
    assert complete(shell, "%device pinbench ") == ["train_loader", "train_batches", "val_loader"]


def test_option_names_and_values(shell) -> None:
    assert complete(shell, "%freeze layer1 --ex") == ["--except"]
    assert complete(shell, "%freeze --bn ") == ["eval", "train", "frozen"]
    assert complete(shell, "%freeze --bn=t") == ["--bn=train"]
    assert complete(shell, "%gpumem reset --") == ["--tracebacks"]
    assert complete(shell, "%gpumem estimate --") == ["--input-shape", "--optimizer"]
    assert "AdamW" in complete(shell, "%gpumem estimate --optimizer Ad")


def test_fit_offers_loaders_models_optimizers_losses(shell) -> None:
    assert complete(shell, "%fit train_") == ["train_loader", "train_batches"]
    assert complete(shell, "%fit ") == [
        "model",
        "features",
        "train_loader",
        "train_batches",
        "val_loader",
    ]
    assert complete(shell, "%fit model t") == ["train_loader", "train_batches"]
    assert complete(shell, "%fit model train_loader --val v") == ["val_loader"]
    assert complete(shell, "%fit train_loader --opt ") == ["opt"]
    assert complete(shell, "%fit train_loader --loss c") == ["cross_entropy", "criterion"]


# -- registration and side effects ---------------------------------------------------


def _ours(shell) -> list:
    return [m for m in shell.Completer.custom_matchers if isinstance(m.__self__, MagicCompleter)]


def test_unload_removes_the_completer_and_load_adds_it_once(shell) -> None:
    assert len(_ours(shell)) == 1
    shell.run_line_magic("unload_ext", "torchmagic")
    assert _ours(shell) == []
    assert "layer1" not in complete(shell, "%freeze la")
    shell.run_line_magic("load_ext", "torchmagic")
    shell.run_line_magic("load_ext", "torchmagic")
    assert len(_ours(shell)) == 1
    assert complete(shell, "%freeze model.fc") == ["model.fc"]


def test_completion_runs_no_forward_and_changes_nothing(shell) -> None:
    model = shell.user_ns["model"]
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    flags = [p.requires_grad for p in model.parameters()]
    names = set(shell.user_ns)
    for text in ("%freeze la", "%fit ", "%tm use ", "%freeze layer1-", "%gpumem estimate "):
        complete(shell, text)
    assert calls == []
    assert [p.requires_grad for p in model.parameters()] == flags
    assert set(shell.user_ns) == names
    assert shell.user_ns["opt"].param_groups[0]["params"][0] is next(model.parameters())


def test_other_lines_are_left_to_ipython(shell) -> None:
    completer = _ours(shell)[0].__self__
    assert completer.complete("%time la") is None
    assert completer.complete("%freeze") is None  # the magic's name is being typed
    assert completer.complete("x = 1") is None
    assert completer.complete("%%amp b", first_line=False) is None
    assert completer.complete("%freeze '*.b") == ("'*.b", [])
    assert completer.complete("freeze lay") == ("lay", [f"layer{i}" for i in range(1, 5)])
    shell.user_ns["freeze"] = 1  # automagic yields to a variable of that name
    assert completer.complete("freeze lay") is None


# -- the engine, without IPython ----------------------------------------------------


def test_module_paths_see_through_wrappers_and_refuse_nothing() -> None:
    net = Net()
    wrapped = nn.DataParallel(net)
    assert completion.module_paths(wrapped, "layer4.1.") == ["layer4.1.0"]
    assert completion.module_paths(net, "module.f") == ["module.fc"]
    assert completion.module_paths(net, "layer9.") == []  # unknown: nothing, no error
    assert completion.module_paths(net, "layer1..") == []
    assert completion.module_paths(net, "*.b") == []
    assert completion.module_paths(net, "", limit=2) == ["conv1", "bn1"]


def test_loaders_are_told_apart_without_iterating() -> None:
    class Stream:
        def __iter__(self):
            raise AssertionError("iterated")

    assert completion.is_loader(_loader())
    assert completion.is_loader([(torch.zeros(1), torch.zeros(1))])
    assert completion.is_loader([{"x": 1, "y": 2}])
    assert not completion.is_loader(Stream())
    assert not completion.is_loader(["a", "b"])
    assert not completion.is_loader(nn.Sequential(nn.Linear(1, 1)))
    assert not completion.is_loader(torch.zeros(3))
    workspace = Workspace(
        {"ldr": _loader(), "n": 3, "opt": torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1)}
    )
    assert completion.variables(workspace, "loader", "") == ["ldr"]
    assert completion.variables(workspace, "optimizer", "o") == ["opt"]


def test_the_tables_name_what_the_manifest_has() -> None:
    """Renaming an option or a usage word in the magics fails here, not silently."""
    magics = load_manifest()["magics"]
    dests = {a.get("dest") for m in magics for a in m["arguments"] if a["kind"] == "option"}
    assert set(OPTION_VALUES) <= dests
    positionals = {a["name"] for m in magics for a in m["arguments"] if a["kind"] == "positional"}
    assert set(POSITIONALS) <= positionals
    usages = " ".join(s["usage"] for m in magics for s in m.get("subcommands", ()))
    words = [*USAGE_WORDS, *PATH_WORDS]
    assert all(word in usages.split() or f"[{word}]" in usages for word in words)


# -- every magic completes; each answer says what it names ---------------------------


def kinds(shell, text: str) -> dict[str, str]:
    """Each candidate's text and the type a front end shows beside it."""
    with provisionalcompleter():
        return {c.text: c.type for c in shell.Completer.completions(text, len(text))}


def test_training_magics_offer_models_and_loaders(shell) -> None:
    for magic in ("lr_find", "fine_tune"):
        assert complete(shell, f"%{magic} ") == complete(shell, "%fit ")
        assert complete(shell, f"%{magic} model t") == ["train_loader", "train_batches"]
        assert complete(shell, f"%{magic} train_loader --opt ") == ["opt"]
    assert complete(shell, "%fine_tune train_loader --val v") == ["val_loader"]
    assert complete(shell, "%fit train_loader --unfreeze layer4,la") == [
        f"layer4,layer{i}" for i in range(1, 5)
    ]


def test_load_model_offers_the_zoo_filtered_by_the_prefix(shell) -> None:
    from torchvision import models

    found = complete(shell, "%load_model resnet")
    zoo = [n for n in models.list_models() if n.startswith("resnet")]
    assert found[: len(zoo)] == zoo  # timm's follow once timm is imported
    assert all(n.startswith("resnet") for n in found)
    assert "%reset" not in complete(shell, "%load_model res")
    assert complete(shell, "%load_model t")[:1] == ["timm:"]
    assert set(kinds(shell, "%load_model resnet1").values()) == {"model"}
    weights = complete(shell, "%load_model resnet50 --weights ")
    assert weights[:2] == ["DEFAULT", "none"] and "IMAGENET1K_V2" in weights


def test_timm_names_after_the_prefix(shell, monkeypatch) -> None:
    monkeypatch.setattr(
        completion, "_timm_models", lambda: ("convnext_atto", "zz_timm_only", "resnet18")
    )
    assert complete(shell, "%load_model timm:conv") == ["timm:convnext_atto"]
    # bare names are timm's too once timm is imported (importing it takes seconds)
    monkeypatch.delitem(sys.modules, "timm", raising=False)
    assert complete(shell, "%load_model zz") == ["zz"]  # nothing: the text typed
    monkeypatch.setitem(sys.modules, "timm", types.ModuleType("timm"))
    assert complete(shell, "%load_model zz") == ["zz_timm_only"]
    assert complete(shell, "%load_model resnet18") == ["resnet18"]  # once


def test_device_compare_takes_a_model_then_a_loader(shell) -> None:
    assert complete(shell, "%device compare ") == complete(shell, "%fit ")
    assert complete(shell, "%device compare model ") == [
        "train_loader",
        "train_batches",
        "val_loader",
    ]
    # the words are all there: the options come next (not IPython's 150 names)
    assert complete(shell, "%device compare train_loader ") == ["--steps", "--loss", "--opt"]
    assert complete(shell, "%summary model ") == ["--depth", "--input-shape"]


def test_tm_completes_exactly_the_documented_subcommands(shell) -> None:
    heading = next(
        line
        for line in (ROOT / "docs/magics.md").read_text().splitlines()
        if line.startswith("### `%tm ")
    )
    documented = [part.split()[0] for part in heading.strip("#` ").removeprefix("%tm ").split("|")]
    assert complete(shell, "%tm ") == documented
    assert complete(shell, "%tm help f") == ["freeze", "fit", "fine_tune"]
    assert "%%amp" in complete(shell, "%tm help %")


def test_every_magic_completes_something(shell) -> None:
    for magic in load_manifest()["magics"]:
        escape = "%%" if magic["kind"] == "cell" else "%"
        found = complete(shell, f"{escape}{magic['name']} ")
        assert found, magic["name"]
        assert not any(c.startswith("%") for c in found), magic["name"]  # not IPython's list


def test_nothing_to_offer_keeps_ipythons_list_away(shell) -> None:
    """A subcommand that takes no words (or a word that matches nothing) answers with
    the text typed, so TAB changes nothing instead of offering keywords and files."""
    assert kinds(shell, "%tm undo ") == {"": "nothing to complete"}
    assert kinds(shell, "%freeze zzz") == {"zzz": "nothing to complete"}
    assert complete(shell, "%tm history x") == ["x"]


def test_save_load_and_export_complete_files(shell, tmp_path, monkeypatch) -> None:
    for name in ("run.pt", "run.py", "notes.txt", ".hidden.pt"):
        (tmp_path / name).write_text("")
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    assert complete(shell, "%tm save ") == ["runs/", "notes.txt", "run.pt", "run.py"]
    assert kinds(shell, "%tm load r") == {"runs/": "folder", "run.pt": "file", "run.py": "file"}
    assert complete(shell, "%tm export run.p") == ["run.pt", "run.py"]
    assert complete(shell, "%tm load .h") == [".hidden.pt"]  # hidden once asked for
    assert complete(shell, f"%tm load {tmp_path}/no") == [f"{tmp_path}/notes.txt"]
    assert complete(shell, "%tm save run.pt ") == ["--sync"]


def test_candidates_say_what_they_name(shell) -> None:
    assert set(kinds(shell, "%freeze la").values()) == {"block"}
    fit = kinds(shell, "%fit ")
    assert fit["model"] == "model" and fit["train_loader"] == "loader"
    assert set(kinds(shell, "%freeze layer1 --").values()) == {"option"}
    assert kinds(shell, "%unfreeze layer4 l")["lr="] == "option"
    assert set(kinds(shell, "%tm ").values()) == {"subcommand"}
    assert kinds(shell, "%fit train_loader --opt ") == {"opt": "optimizer"}
    assert kinds(shell, "%fit train_loader --loss c")["criterion"] == "loss"
    assert kinds(shell, "%freeze --bn ")["eval"] == "value"


def test_zoo_lists_are_read_once(monkeypatch) -> None:
    from torchvision import models

    calls = []
    completion._torchvision_models.cache_clear()
    real = models.list_models
    monkeypatch.setattr(models, "list_models", lambda *a, **k: calls.append(1) or real(*a, **k))
    for typed in ("res", "vit", "efficientnet_b"):
        assert all(n.startswith(typed) for n in completion.zoo_models(typed))
    assert calls == [1]
    completion._torchvision_models.cache_clear()
