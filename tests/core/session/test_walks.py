"""One context per surgery command: the model is walked a bounded number of times. A walk
is counted as one iteration of a deep block's child table: every whole-model walk, torch's
or torchmagic's, passes through it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import timm
import torch
import torchvision
from IPython.utils.capture import capture_output

from torchmagic import Session

# the model walked when it is bound and again after the change; freeze, the session's
# first command, also looks for the only model among the variables
MAX_MODEL_WALKS = {"unfreeze": 3, "freeze": 3, "replace_head": 3}


class Counting(dict):
    """A dict that counts how often it is iterated."""

    walks = 0

    def items(self):
        self.walks += 1
        return super().items()

    def values(self):
        self.walks += 1
        return super().values()

    def keys(self):
        self.walks += 1
        return super().keys()

    def __iter__(self):
        self.walks += 1
        return super().__iter__()


def _count_walks(block: torch.nn.Module) -> Counting:
    """Counts the iterations of ``block``'s child table: a deep block, which every walk
    of the whole model passes through."""
    table = Counting(block.__dict__["_modules"])
    object.__setattr__(block, "_modules", table)
    return table


def _count_model_walks(model: torch.nn.Module) -> Counting:
    return _count_walks(model.layer1[0])


def _setups() -> dict[str, tuple[Callable, Callable]]:
    """Each command after its setup, through a Session and through the magics."""
    return {
        "unfreeze": (
            lambda tm: tm.freeze(),
            lambda tm: tm.unfreeze("layer4", lr=1e-4),
        ),
        "freeze": (lambda tm: None, lambda tm: tm.freeze("layer3")),
        "replace_head": (
            lambda tm: tm.freeze("layer1-4"),
            lambda tm: tm.replace_head("fc", 5),
        ),
    }


MAGICS = {
    "unfreeze": ("freeze model", "unfreeze layer4 lr=1e-4"),
    "freeze": (None, "freeze layer3"),
    "replace_head": ("freeze layer1-4", "replace_head fc 5"),
}


DONE = {
    "unfreeze": lambda model: all(p.requires_grad for p in model.layer4.parameters()),
    "freeze": lambda model: not any(p.requires_grad for p in model.layer3.parameters()),
    "replace_head": lambda model: model.fc.out_features == 5,
}


def _resnet() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


@pytest.mark.parametrize("command", sorted(MAX_MODEL_WALKS))
def test_a_session_command_walks_the_model_a_bounded_number_of_times(command: str) -> None:
    model, opt = _resnet()
    tm = Session(namespace={"model": model, "optimizer": opt})
    setup, run = _setups()[command]
    setup(tm)
    table = _count_model_walks(model)
    change = run(tm)
    assert not change.unchanged and change.action == command
    assert 1 <= table.walks <= MAX_MODEL_WALKS[command]


@pytest.mark.parametrize("command", sorted(MAX_MODEL_WALKS))
def test_a_magic_walks_the_model_a_bounded_number_of_times(ip, command: str) -> None:
    model, opt = _resnet()
    ip.user_ns.update(model=model, optimizer=opt)
    setup, line = MAGICS[command]
    with capture_output():
        if setup is not None:
            ip.run_line_magic(*setup.split(" ", 1))
        table = _count_model_walks(model)
        ip.run_line_magic(*line.split(" ", 1))
    assert 1 <= table.walks <= MAX_MODEL_WALKS[command]
    assert DONE[command](model)


def test_the_counter_sees_a_whole_model_walk() -> None:
    """What the counts rest on: torch's own walks pass through the counted table."""
    model, _ = _resnet()
    table = _count_model_walks(model)
    list(model.named_modules())
    sum(p.numel() for p in model.parameters())
    model.state_dict()
    assert table.walks == 3


class CountingNamespace(Counting):
    """A user namespace that counts how often it is iterated. IPython copies it to expand
    ``$name`` in a magic's line: that copy is IPython's, not counted."""

    def copy(self) -> dict:
        return dict(dict.items(self))


@pytest.mark.parametrize("command", sorted(MAX_MODEL_WALKS))
def test_a_session_command_walks_the_namespace_once(command: str) -> None:
    model, opt = _resnet()
    namespace = CountingNamespace(model=model, optimizer=opt)
    tm = Session(namespace=namespace)
    setup, run = _setups()[command]
    setup(tm)
    namespace.walks = 0
    change = run(tm)
    assert not change.unchanged and change.action == command
    assert namespace.walks == 1


@pytest.mark.parametrize("command", sorted(MAX_MODEL_WALKS))
def test_a_magic_walks_the_namespace_once(ip, command: str) -> None:
    model, opt = _resnet()
    ip.user_ns = CountingNamespace(ip.user_ns)
    ip.user_ns.update(model=model, optimizer=opt)
    setup, line = MAGICS[command]
    with capture_output():
        if setup is not None:
            ip.run_line_magic(*setup.split(" ", 1))
        ip.user_ns.walks = 0
        ip.run_line_magic(*line.split(" ", 1))
    assert ip.user_ns.walks == 1
    assert DONE[command](model)


def _trains(module: torch.nn.Module) -> bool:
    return all(p.requires_grad for p in module.parameters())


def _stopped(module: torch.nn.Module) -> bool:
    return not any(p.requires_grad for p in module.parameters())


def _adapted(module: torch.nn.Module) -> bool:
    return hasattr(module, "lora_A")


# Every other target grammar, and undo, under the same bound: the setup (Session, then
# magic lines), the command (Session, then magic line) and what it leaves.
OTHER_CASES: dict[str, tuple[Callable, tuple[str, ...], Callable, str, Callable]] = {
    "freeze a glob": (
        lambda tm: None,
        (),
        lambda tm: tm.freeze("*.bn*"),
        'freeze model "*.bn*"',
        lambda m: _stopped(m.layer2[1].bn2) and _trains(m.layer2[1].conv2),
    ),
    "freeze a glob through the variable": (
        lambda tm: None,
        (),
        lambda tm: tm.freeze("model.*.bn*"),
        'freeze "model.*.bn*"',
        lambda m: _stopped(m.layer2[1].bn2) and _trains(m.layer2[1].conv2),
    ),
    "freeze name endings": (
        lambda tm: None,
        (),
        lambda tm: tm.freeze("bn1,bn2"),
        "freeze model bn1,bn2",
        lambda m: _stopped(m.layer3[0].bn2) and _trains(m.layer3[0].downsample),
    ),
    "freeze except a glob": (
        lambda tm: None,
        (),
        lambda tm: tm.freeze(exclude=["*.bn*"]),
        'freeze model --except "*.bn*"',
        lambda m: _trains(m.layer2[1].bn2) and _stopped(m.layer2[1].conv2),
    ),
    "freeze except name endings": (
        lambda tm: None,
        (),
        lambda tm: tm.freeze(exclude=["bn1,bn2"]),
        "freeze model --except bn1,bn2",
        lambda m: _trains(m.layer3[0].bn2) and _stopped(m.layer3[0].downsample),
    ),
    "freeze the whole model": (
        lambda tm: None,
        (),
        lambda tm: tm.freeze(),
        "freeze model",
        _stopped,
    ),
    "freeze the model except its head": (
        lambda tm: None,
        (),
        lambda tm: tm.freeze(exclude=["fc"]),
        "freeze model --except fc",
        lambda m: _stopped(m.layer1) and _trains(m.fc),
    ),
    "freeze a range": (
        lambda tm: None,
        (),
        lambda tm: tm.freeze("layer1-3"),
        "freeze layer1-3",
        lambda m: _stopped(m.layer1) and _trains(m.layer4),
    ),
    "freeze a range except a block": (
        lambda tm: None,
        (),
        lambda tm: tm.freeze("layer1-4", exclude=["layer4.1"]),
        "freeze layer1-4 --except layer4.1",
        lambda m: _stopped(m.layer1) and _trains(m.layer4[1]) and _stopped(m.layer4[0]),
    ),
    "freeze the whole model with frozen BatchNorm": (
        lambda tm: None,
        (),
        lambda tm: tm.freeze(bn="frozen"),
        "freeze model --bn frozen",
        lambda m: _stopped(m) and type(m.layer1[0].bn1).__name__ == "FrozenBatchNorm2d",
    ),
    "unfreeze the whole model": (
        lambda tm: tm.freeze(),
        ("freeze model",),
        lambda tm: tm.unfreeze(),
        "unfreeze model",
        _trains,
    ),
    "unfreeze a range with an lr": (
        lambda tm: tm.freeze(),
        ("freeze model",),
        lambda tm: tm.unfreeze("layer1-3", lr=1e-4),
        "unfreeze layer1-3 lr=1e-4",
        lambda m: _trains(m.layer1) and _stopped(m.layer4),
    ),
    "unfreeze a glob": (
        lambda tm: tm.freeze(),
        ("freeze model",),
        lambda tm: tm.unfreeze("*.bn*"),
        'unfreeze "*.bn*"',
        lambda m: _trains(m.layer2[1].bn2) and _stopped(m.layer2[1].conv2),
    ),
    "unfreeze name endings": (
        lambda tm: tm.freeze(),
        ("freeze model",),
        lambda tm: tm.unfreeze("bn1,bn2", lr=1e-4),
        "unfreeze bn1,bn2 lr=1e-4",
        lambda m: _trains(m.layer3[0].bn2) and _stopped(m.layer3[0].downsample),
    ),
    "unfreeze a range except a glob": (
        lambda tm: tm.freeze(),
        ("freeze model",),
        lambda tm: tm.unfreeze("layer3-4", exclude=["*.bn*"]),
        'unfreeze layer3-4 --except "*.bn*"',
        lambda m: _trains(m.layer3[1].conv2) and _stopped(m.layer3[1].bn2),
    ),
    "lora a block": (
        lambda tm: None,
        (),
        lambda tm: tm.lora("layer4", r=4),
        "lora layer4 r=4",
        lambda m: _adapted(m.layer4[1].conv2) and not _adapted(m.layer3[1].conv2),
    ),
    "lora name endings": (
        lambda tm: None,
        (),
        lambda tm: tm.lora("conv1,conv2", r=4),
        "lora conv1,conv2 r=4",
        lambda m: _adapted(m.layer1[0].conv2) and not _adapted(m.layer2[0].downsample[0]),
    ),
    "lora a glob": (
        lambda tm: None,
        (),
        lambda tm: tm.lora("layer4.*.conv*", r=4),
        'lora "layer4.*.conv*" r=4',
        lambda m: _adapted(m.layer4[0].conv1) and not _adapted(m.layer3[0].conv1),
    ),
    "undo a freeze": (
        lambda tm: tm.freeze("layer3"),
        ("freeze layer3",),
        lambda tm: tm.undo(),
        "tm undo",
        lambda m: _trains(m),
    ),
    "undo an unfreeze": (
        lambda tm: (tm.freeze(), tm.unfreeze("layer4", lr=1e-4)),
        ("freeze model", "unfreeze layer4 lr=1e-4"),
        lambda tm: tm.undo(),
        "tm undo",
        lambda m: _stopped(m),
    ),
    "undo a head": (
        lambda tm: tm.replace_head("fc", 5),
        ("replace_head fc 5",),
        lambda tm: tm.undo(),
        "tm undo",
        lambda m: m.fc.out_features == 1000,
    ),
    "undo a lora": (
        lambda tm: tm.lora("layer4", r=4),
        ("lora layer4 r=4",),
        lambda tm: tm.undo(),
        "tm undo",
        lambda m: not _adapted(m.layer4[1].conv2) and _trains(m),
    ),
}


@pytest.mark.parametrize("case", sorted(OTHER_CASES))
def test_every_grammar_and_undo_walk_the_model_at_most_three_times(case: str) -> None:
    setup, _, run, _, done = OTHER_CASES[case]
    model, opt = _resnet()
    tm = Session(namespace={"model": model, "optimizer": opt})
    setup(tm)
    table = _count_model_walks(model)
    change = run(tm)
    assert not change.unchanged
    assert 1 <= table.walks <= 3
    assert done(model)


@pytest.mark.parametrize("case", sorted(OTHER_CASES))
def test_every_grammar_and_undo_walk_the_model_at_most_three_times_as_magics(ip, case: str) -> None:
    _, setup, _, line, done = OTHER_CASES[case]
    model, opt = _resnet()
    ip.user_ns.update(model=model, optimizer=opt)
    with capture_output():
        for magic in setup:
            ip.run_line_magic(*magic.split(" ", 1))
        table = _count_model_walks(model)
        ip.run_line_magic(*line.split(" ", 1))
    assert 1 <= table.walks <= 3
    assert done(model)


def test_a_declared_head_is_named_from_the_walk() -> None:
    """timm declares its head (``get_classifier``): the head's path is read from the
    command's walk, not from another one."""
    model = timm.create_model("convnext_atto", pretrained=False, num_classes=10)
    tm = Session(namespace={"model": model, "optimizer": torch.optim.AdamW(model.parameters())})
    table = _count_walks(model.stages[0].blocks[0])
    change = tm.replace_head(None, 5)
    assert change.action == "replace_head" and model.head.fc.out_features == 5
    assert 1 <= table.walks <= 3
