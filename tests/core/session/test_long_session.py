"""A random long session through the real magics: a small ResNet with AdamW and a
scheduler, edited by a seeded random sequence of %freeze, %unfreeze (with and without
lr=), %replace_head, %lora (add, merge, off, on), %tm undo, %tm save + %tm load into a
freshly built model, %amp and one-step %fit on a tiny DataLoader.

Each command either succeeds or is one one-line ``UsageError`` that changed nothing; no
command ever trips the engine's own post-condition (``BrokenInvariant``), and the test's
own check of the same invariants (every trainable parameter in exactly one group, no
frozen one, scheduler lists one entry per group, ``state_dict()`` working) holds after
each. On sampled successful edits, ``%tm undo`` restores weights, flags, modules, groups
and optimizer state bit for bit, and the edit is then run again to keep the session going.
"""

from __future__ import annotations

import copy
import importlib.util
import random
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from checkpoint_helpers import assert_same as assert_same_by_name
from checkpoint_helpers import state, structure
from paths import ROOT
from snapshots import assert_same, snapshot
from torchmagic.core.session import invariants
from torchmagic.magics import loaded

pytest.importorskip("peft")


def _small_resnet_class() -> type[nn.Module]:
    """The quickstart's ResNet-18 layout (examples/digits.py), loaded from its file."""
    spec = importlib.util.spec_from_file_location(
        "digits_example", ROOT / "examples/digits.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.SmallResNet


# torchvision's BasicBlock in ResNet-18's layout at a few channels, for 1 x 8 x 8 images:
# every command is cheap
SmallResNet = _small_resnet_class()


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, object]:
    """The notebook's first cell, as ``%tm load`` needs it rebuilt: model, AdamW with
    decay / no-decay groups, a per-epoch StepLR."""
    torch.manual_seed(seed)
    model = SmallResNet(3, (4, 8, 8, 8))
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    opt = torch.optim.AdamW(
        [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, weight_decay=0.05
    )
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)


def loader() -> DataLoader:
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(8, 1, 8, 8, generator=gen)
    data = TensorDataset(images, torch.randint(0, 2, (8,), generator=gen))
    return DataLoader(data, batch_size=4)


TARGETS = [
    "conv1", "bn1", "layer1", "layer2", "layer3", "layer4", "layer1-2", "layer2-4",
    "layer4.1", "layer3.0.conv1", "fc", '"*bn*"', "model", "model.layer1-3", "layr5",
]  # fmt: skip
LORA_TARGETS = ["layer4", '"layer4.*.conv1"', "layer3.1.conv2", "fc", "conv1,conv2", "nope"]
EDITS = ("freeze", "unfreeze", "replace_head", "lora")  # whose undo is sampled


KINDS = {  # kind of command: its weight in the draw
    "freeze": 18, "unfreeze": 10, "unfreeze_lr": 10, "replace_head": 7, "lora": 8,
    "lora_merge": 4, "lora_switch": 4, "undo": 12, "save_load": 4, "amp": 6, "fit": 8,
}  # fmt: skip


def random_command(rng: random.Random, save_path: Path) -> tuple[str, str, str]:
    """One (kind, magic, line), drawn with weights that keep the session mostly editing."""
    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
    if kind == "freeze":
        extra = rng.choice(["", "", " --bn eval", " --bn train", " --bn frozen"])
        target = rng.choice([*TARGETS, "model --except fc"])
        return kind, "freeze", target + extra
    if kind == "unfreeze":
        return kind, "unfreeze", rng.choice(TARGETS)
    if kind == "unfreeze_lr":
        lr = rng.choice(["lr=1e-4", "lr=3e-3", "lr=1e-5:1e-4", "lr=0", "lr=-1"])
        return kind, "unfreeze", f"{rng.choice(TARGETS)} {lr}"
    if kind == "replace_head":
        where = rng.choice(["fc", "auto", "model.fc", "layer4"])
        return kind, "replace_head", f"{where} {rng.randint(2, 5)}"
    if kind == "lora":
        options = rng.choice(["r=2", "r=2 alpha=4", "r=1 lr=1e-3", "r=2 --rslora", "r=0"])
        return kind, "lora", f"{rng.choice(LORA_TARGETS)} {options}"
    if kind == "lora_merge":
        return kind, "lora", rng.choice(["merge", "merge model"])
    if kind == "lora_switch":
        return kind, "lora", rng.choice(["off", "on"])
    if kind == "undo":
        return kind, "tm", "undo"
    if kind == "save_load":
        return kind, "tm", f"save {save_path}"
    if kind == "amp":
        return kind, "amp", rng.choice(["on bf16", "off", "on", "on fp16", ""])
    return kind, "fit", "train_loader --max-steps 1"


@dataclass
class Problems:
    """What the session got wrong, each with the command index and line."""

    tracebacks: list[str] = field(default_factory=list)
    invariants: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)  # a refusal that changed something
    undos: list[str] = field(default_factory=list)  # an undo that was not bit for bit
    checkpoints: list[str] = field(default_factory=list)  # a load that differs from the save

    def all(self) -> list[str]:
        return self.tracebacks + self.invariants + self.refusals + self.undos + self.checkpoints


class LongSession:
    """One shell, one namespace, one seeded stream of commands."""

    def __init__(self, ip, seed: int, tmp: Path) -> None:
        self.ip = ip
        self.rng = random.Random(seed)
        self.save_path = tmp / "session.pt"
        self.problems = Problems()
        self.successes: dict[str, int] = {}
        self.refused: dict[str, int] = {}
        self.undos_checked = 0
        self.loads = 0
        self.log: list[str] = []  # every line run, checks included, to replay a problem
        model, opt, sched = build(seed=0)
        ip.user_ns.update(model=model, optimizer=opt, scheduler=sched, train_loader=loader())

    @property
    def session(self):
        return loaded(self.ip).session

    def objects(self) -> tuple[nn.Module, torch.optim.Optimizer, object]:
        ns = self.ip.user_ns
        return ns["model"], ns["optimizer"], ns["scheduler"]

    def observed(self) -> dict:
        """Everything a refusal must leave as it was, exactly."""
        model, opt, sched = self.objects()
        return {
            "model": snapshot(model, opt),
            "scheduler": copy.deepcopy(sched.state_dict()),  # it shares its lists
            "history": [(e.command, e.stale) for e in self.session.history()],
            "amp": self.session.amp_status(),
        }

    def magic(self, name: str, line: str) -> None:
        self.log.append(f"%{name} {line}")
        with capture_output():
            self.ip.run_line_magic(name, line)

    def step(self, index: int) -> None:
        kind, name, line = random_command(self.rng, self.save_path)
        where = f"#{index} %{name} {line}"
        before = self.observed()
        try:
            self.magic(name, line)
        except UsageError as error:
            self.refused[kind] = self.refused.get(kind, 0) + 1
            self._check_refusal(where, error, before)
            return
        except Exception:  # noqa: BLE001 - a traceback is what this test looks for
            self.problems.tracebacks.append(f"{where}: {traceback.format_exc(limit=-3)}")
            return
        self.successes[kind] = self.successes.get(kind, 0) + 1
        self._check_invariants(where)
        recorded = len(self.session.history()) > len(before["history"])  # not a no-op
        if name in EDITS and recorded and self.rng.random() < 0.5:
            self._check_undo(where, name, line, before)
        if name == "tm" and line.startswith("save"):
            self._load_into_fresh_model(where)

    def _check_refusal(self, where: str, error: UsageError, before: dict) -> None:
        if type(error) is not UsageError or "\n" in str(error):
            self.problems.refusals.append(f"{where}: not one UsageError line: {error!r}")
        after = self.observed()
        try:
            assert_same(before["model"], after["model"])
            for key in ("scheduler", "history", "amp"):
                assert before[key] == after[key], f"{key} differs"
        except AssertionError as failure:
            self.problems.refusals.append(f"{where}: refused ({error}) but changed: {failure}")

    def _check_invariants(self, where: str) -> None:
        """The engine's invariants, checked from outside by identity and length."""
        model, opt, sched = self.objects()
        count: dict[int, int] = {}
        for group in opt.param_groups:
            for p in group["params"]:
                count[id(p)] = count.get(id(p), 0) + 1
        wrong = [
            n
            for n, p in model.named_parameters()
            if count.get(id(p), 0) != (1 if p.requires_grad else 0)
        ]
        live = {id(p) for p in model.parameters()}
        wrong += [f"a parameter outside the model ({tuple(k)})" for k in count if k not in live]
        if len(sched.base_lrs) != len(opt.param_groups):
            wrong.append(f"base_lrs {len(sched.base_lrs)} for {len(opt.param_groups)} groups")
        try:
            opt.state_dict()
        except Exception as error:  # noqa: BLE001
            wrong.append(f"state_dict() fails: {error!r}")
        if wrong:
            self.problems.invariants.append(f"{where}: {wrong[:3]}")

    def _check_undo(self, where: str, name: str, line: str, before: dict) -> None:
        try:
            self.magic("tm", "undo")
        except Exception as error:  # noqa: BLE001
            self.problems.undos.append(f"{where}: undo raised {error!r}")
            return
        self.undos_checked += 1
        after = self.observed()
        try:
            assert_same(before["model"], after["model"])
            assert before["scheduler"] == after["scheduler"], "scheduler differs"
            assert before["history"] == after["history"], (
                f"history {before['history']} -> {after['history']}"
            )
        except AssertionError as failure:
            self.problems.undos.append(f"{where}: undo not bit for bit: {failure}")
            return
        try:  # the same edit again, so the session keeps its course
            self.magic(name, line)
        except Exception as error:  # noqa: BLE001
            self.problems.undos.append(f"{where}: the edit again after its undo: {error!r}")

    def _load_into_fresh_model(self, where: str) -> None:
        """``%tm load`` on variables built as the first cell built them: the same structure
        and state by name, then the session goes on with the fresh objects."""
        model, opt, sched = self.objects()
        expected = (structure(model, opt), state(model, opt), copy.deepcopy(sched.state_dict()))
        amp = self.session.amp_status()
        fresh, fresh_opt, fresh_sched = build(seed=9)
        self.ip.user_ns.update(model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
        try:
            self.magic("tm", f"load {self.save_path}")
        except Exception:  # noqa: BLE001
            self.problems.checkpoints.append(f"{where}: load: {traceback.format_exc(limit=-3)}")
            self.ip.user_ns.update(model=model, optimizer=opt, scheduler=sched)
            return
        self.loads += 1
        try:
            assert_same_by_name(expected[0], structure(fresh, fresh_opt))
            assert_same_by_name(expected[1], state(fresh, fresh_opt))
            assert expected[2] == fresh_sched.state_dict(), "scheduler differs"
            assert amp == self.session.amp_status(), "amp differs"
        except AssertionError as failure:
            self.problems.checkpoints.append(f"{where}: loaded state differs: {failure}")
        self._check_invariants(f"{where} (loaded)")


def run_session(ip, tmp_path: Path, seed: int, commands: int, monkeypatch) -> LongSession:
    broken: list[str] = []
    original = invariants.BrokenInvariant.__init__

    def record(self, *args, **kwargs):
        broken.append(repr(args))
        original(self, *args, **kwargs)

    monkeypatch.setattr(invariants.BrokenInvariant, "__init__", record)
    long = LongSession(ip, seed, tmp_path)
    for index in range(commands):
        long.step(index)
    long.problems.invariants += [f"BrokenInvariant{args}" for args in broken]
    return long


def _report(long: LongSession) -> str:
    """The first problems, and the whole run written beside the checkpoint to replay it."""
    found = long.problems.all()
    replay = long.save_path.with_name("session.log")
    replay.write_text("\n".join(long.log) + "\n")
    return f"{len(found)} problems (every line run: {replay}):\n" + "\n".join(found[:8])


@pytest.mark.parametrize("seed", [0, 1])
def test_a_random_session_of_75_commands(ip, tmp_path, monkeypatch, seed):
    long = run_session(ip, tmp_path, seed, 75, monkeypatch)
    assert not long.problems.all(), _report(long)
    assert set(long.successes) == set(KINDS), f"never succeeded: {set(KINDS) - set(long.successes)}"
    assert long.undos_checked > 3 and long.loads > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [27, 28, 29, 30])
def test_2000_random_commands_in_four_sessions(ip, tmp_path, monkeypatch, seed):
    """500 commands a session: each ``%tm load`` replays every command saved so far, so
    one session of 2,000 spends most of its time in ever longer replays."""
    long = run_session(ip, tmp_path, seed, 500, monkeypatch)
    assert not long.problems.all(), _report(long)
    assert set(long.successes) == set(KINDS), f"never succeeded: {set(KINDS) - set(long.successes)}"
    assert long.loads > 3 and long.undos_checked > 25
