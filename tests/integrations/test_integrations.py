"""Objects where they really live: Accelerate's wrappers, optimizers held as attributes
(``learner.opt``), models reached through attribute paths, Lightning trainers between
fits and EMA copies, each with the real libraries, asserted on the live objects (every
one failed before discovery walked beyond plain variables)."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
import torchvision
from torch import nn
from torch.optim.swa_utils import AveragedModel

from torchmagic import Session, TorchMagicError


def _in(optimizer: torch.optim.Optimizer, param: nn.Parameter) -> bool:
    return any(p is param for g in optimizer.param_groups for p in g["params"])


def _resnet(num_classes: int = 10) -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None, num_classes=num_classes)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()


# -- Accelerate ----------------------------------------------------------------------


def _prepare(make_scheduler) -> dict:
    """``accelerator.prepare(model, optimizer, scheduler)`` as the user's namespace."""
    accelerate = pytest.importorskip("accelerate")
    model = _resnet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = make_scheduler(optimizer)
    accelerator = accelerate.Accelerator(cpu=True)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "acc": accelerator}


@pytest.fixture
def prepared():
    transformers = pytest.importorskip("transformers")
    return _prepare(lambda opt: transformers.get_linear_schedule_with_warmup(opt, 2, 20))


def test_accelerate_scheduler_is_kept_in_step_through_its_wrapper(prepared):
    tm = Session(namespace=prepared)
    model, optimizer, scheduler = prepared["model"], prepared["optimizer"], prepared["scheduler"]
    tm.freeze("model", exclude=["fc"])
    change = tm.unfreeze("layer4", lr=1e-4)
    inner = scheduler.scheduler
    assert len(inner.base_lrs) == len(optimizer.param_groups) == 2
    assert change.optimizer_name == "optimizer"
    assert change.groups[0].schedulers == ("LambdaLR `scheduler`",)
    for _ in range(5):  # stepping through the wrapper, as the user's loop does
        _step(model, optimizer)
        scheduler.step()
    lam = inner.lr_lambdas[0](inner.last_epoch)
    assert optimizer.param_groups[0]["lr"] == 1e-3 * lam
    assert optimizer.param_groups[1]["lr"] == 1e-4 * lam  # the base-lr rule, exactly
    assert optimizer.state_dict()["param_groups"][1]["initial_lr"] == 1e-4


def test_accelerate_cosine_keeps_the_base_lr_ratio():
    prepared = _prepare(lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10))
    optimizer = prepared["optimizer"]
    tm = Session(namespace=prepared)
    for _ in range(3):
        _step(prepared["model"], optimizer)
        prepared["scheduler"].step()
    tm.freeze("model", exclude=["fc"])
    tm.unfreeze("layer4", lr=1e-4)
    for _ in range(3):
        _step(prepared["model"], optimizer)
        prepared["scheduler"].step()
    head, layer4 = (g["lr"] for g in optimizer.param_groups)
    assert layer4 / head == pytest.approx(0.1, rel=1e-9)  # was 0.126 before


def test_doctor_sees_a_scheduler_out_of_step_inside_the_wrapper(prepared):
    optimizer = prepared["optimizer"]
    optimizer.add_param_group({"params": [nn.Parameter(torch.zeros(3))], "lr": 1e-3})
    report = Session(namespace=prepared).doctor()
    errors = [f for f in report.findings if f.check == "scheduler" and f.severity == "error"]
    assert errors and "LambdaLR" in errors[0].subject


# -- optimizers and models held as attributes ------------------------------------------


class Learner:
    """A user's own training object, holding model and optimizer as attributes."""

    def __init__(self) -> None:
        self.model = _resnet()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, 2)


def test_replace_head_adds_the_new_head_to_an_optimizer_held_as_an_attribute():
    learner = Learner()
    ns = {"learner": learner, "model": learner.model}
    tm = Session(namespace=ns)
    change = tm.replace_head("fc", 5)
    assert change.optimizer_name == "learner.opt"
    assert _in(learner.opt, learner.model.fc.weight) and _in(learner.opt, learner.model.fc.bias)
    assert len(learner.sched.base_lrs) == len(learner.opt.param_groups)


def test_opt_accepts_a_dotted_path_and_targets_go_through_attributes():
    learner = Learner()
    tm = Session(namespace={"learner": learner})
    change = tm.freeze("learner.model.layer1", optimizer="learner.opt")
    assert change.model_name == "learner.model" and change.optimizer_name == "learner.opt"
    assert not any(p.requires_grad for p in learner.model.layer1.parameters())
    assert not any(_in(learner.opt, p) for p in learner.model.layer1.parameters())
    assert tm.summary("learner.model").model_name == "learner.model"
    tm.undo()
    assert all(_in(learner.opt, p) for p in learner.model.layer1.parameters())


def test_a_model_in_a_container_says_to_bind_it():
    tm = Session(namespace={"models": {"a": _resnet()}})
    with pytest.raises(TorchMagicError, match=r"bind it: m = models\['a'\]"):
        tm.freeze("layer1")


def test_doctor_finds_a_head_swapped_by_hand_outside_the_learners_optimizer():
    learner = Learner()
    learner.model.fc = nn.Linear(512, 5)
    report = Session(namespace={"learner": learner}).doctor()
    assert any(f.check == "head-replaced-by-hand" for f in report.findings)


# -- Lightning -----------------------------------------------------------------------


def _lightning():
    lightning = pytest.importorskip("lightning.pytorch")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")

    class Lit(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torchvision.models.resnet18(weights=None, num_classes=4)

        def training_step(self, batch, index):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}

    def trainer():
        return lightning.Trainer(
            accelerator="cpu",
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )

    return Lit, trainer


def _loader(classes: int) -> torch.utils.data.DataLoader:
    torch.manual_seed(1)
    data = torch.utils.data.TensorDataset(
        torch.randn(8, 3, 32, 32), torch.randint(0, classes, (8,))
    )
    return torch.utils.data.DataLoader(data, batch_size=4)


@pytest.mark.slow
def test_lightning_between_fits():
    Lit, make_trainer = _lightning()
    lit, trainer = Lit(), make_trainer()
    trainer.fit(lit, _loader(4))
    ns = {"lit": lit, "trainer": trainer}
    tm = Session(namespace=ns)
    freeze = tm.freeze("lit.net", exclude=["net.fc"])
    assert freeze.optimizer_name == "trainer.optimizers[0]"
    before = {n: p.detach().clone() for n, p in lit.named_parameters()}
    with pytest.raises(TorchMagicError, match="trainer builds it again at every fit") as refused:
        tm.unfreeze("lit.net.layer4", lr=1e-4)
    assert "\n" not in str(refused.value)
    assert not any(p.requires_grad for p in lit.net.layer4.parameters())  # nothing changed
    change = tm.replace_head("lit.net.fc", 7)
    assert any("configure_optimizers" in n for n in change.effect.notes)
    stats = lit.net.bn1.running_mean.clone()
    head = lit.net.fc.weight.detach().clone()
    trainer = ns["trainer"] = make_trainer()
    trainer.fit(lit, _loader(7))  # configure_optimizers builds a new optimizer
    assert _in(trainer.optimizers[0], lit.net.fc.weight)
    assert not torch.equal(head, lit.net.fc.weight)  # the new head trained
    frozen = [n for n, p in lit.named_parameters() if not n.startswith("net.fc")]
    assert all(torch.equal(before[n], dict(lit.named_parameters())[n]) for n in frozen)
    assert torch.equal(stats, lit.net.bn1.running_mean)  # BatchNorm held in eval


# -- EMA copies ----------------------------------------------------------------------


def _ema_helpers():
    timm_utils = pytest.importorskip("timm.utils")
    return [AveragedModel, timm_utils.ModelEmaV3]


@pytest.mark.parametrize("make_ema", _ema_helpers(), ids=["AveragedModel", "ModelEmaV3"])
def test_replace_head_keeps_an_ema_copy_in_step(make_ema):
    model = _resnet()
    ema = make_ema(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tm = Session(namespace={"model": model, "ema": ema, "optimizer": optimizer})
    assert tm.workspace.resolve_model()[0] == "model"  # an EMA copy is never the default
    change = tm.replace_head("fc", 5)
    assert any("`ema`" in n for n in change.effect.notes)
    copy = ema.module
    assert copy.fc.weight.shape == (5, 512)
    assert torch.equal(copy.fc.weight, model.fc.weight) and copy.fc.weight is not model.fc.weight
    assert copy.fc.weight.requires_grad == copy.conv1.weight.requires_grad
    frozen = tm.freeze("layer1")
    assert all(p.requires_grad == copy.conv1.weight.requires_grad for p in copy.layer1.parameters())
    assert not any("ema" in n for n in frozen.effect.notes)
    _step(model, optimizer)
    old = copy.fc.weight.detach().clone()
    if isinstance(ema, AveragedModel):
        ema.update_parameters(model)  # first update copies
        ema.update_parameters(model)
        assert torch.equal(copy.fc.weight, model.fc.weight)
    else:
        ema.update(model)
        expected = old * ema.decay + model.fc.weight.detach() * (1 - ema.decay)
        assert torch.allclose(copy.fc.weight, expected, rtol=1e-5, atol=1e-7)
    assert ema.module(torch.randn(2, 3, 32, 32)).shape == (2, 5)
    tm.undo()  # the freeze
    tm.undo()  # the head, in both
    assert model.fc.weight.shape == copy.fc.weight.shape == (10, 512)


def test_doctor_reports_an_ema_copy_that_no_longer_matches():
    model = _resnet()
    ema = AveragedModel(model)
    model.fc = nn.Linear(512, 5)  # by hand: the copy still has 10 classes
    report = Session(namespace={"model": model, "ema": ema}).doctor()
    found = [f for f in report.findings if f.check == "ema-mismatch"]
    assert found and found[0].severity == "error" and "fc.weight" in found[0].message


def test_two_real_models_ask_which_in_the_front_ends_spelling(ip):
    ip.user_ns.update(a=_resnet(), b=_resnet(), ema=AveragedModel(_resnet()))
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="make one current with %tm use a$"):
        ip.run_line_magic("freeze", "layer1")
    with pytest.raises(TorchMagicError, match=r"tm\.use\(\"a\"\)"):
        Session(namespace=dict(ip.user_ns)).freeze("layer1")


# -- the same cases typed as magics --------------------------------------------------


def test_magics_reach_a_learners_model_and_optimizer(ip, capsys):
    from IPython.core.error import UsageError

    learner = Learner()
    ip.user_ns["learner"] = learner
    ip.run_line_magic("freeze", "learner.model --except fc --opt learner.opt")
    assert not learner.model.layer1[0].conv1.weight.requires_grad
    assert not _in(learner.opt, learner.model.layer1[0].conv1.weight)
    ip.run_line_magic("replace_head", "learner.model.fc 5")
    assert _in(learner.opt, learner.model.fc.weight)
    capsys.readouterr()
    ip.run_line_magic("summary", "learner.model")
    assert "learner.model" in capsys.readouterr().out
    with pytest.raises(UsageError, match="--opt learner.nope: nothing there") as refused:
        ip.run_line_magic("unfreeze", "learner.model.layer4 --opt learner.nope")
    assert "\n" not in str(refused.value)


def test_magics_with_accelerate_name_the_scheduler_they_kept_in_step(ip, prepared, capsys):
    ip.user_ns.update(prepared)
    ip.run_line_magic("freeze", "model --except fc")
    capsys.readouterr()
    ip.run_line_magic("unfreeze", "layer4 lr=1e-4")
    assert "lr schedule: LambdaLR `scheduler`" in capsys.readouterr().out
    prepared["optimizer"].step()
    prepared["scheduler"].step()  # crashed with "zip() argument 2 is shorter" before
    assert len(prepared["scheduler"].scheduler.get_last_lr()) == 2


def test_an_unknown_optimizer_error_is_spelled_as_flags(ip):
    from IPython.core.error import UsageError

    ip.user_ns["model"] = _resnet()
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("unfreeze", "layer4 lr=1e-4")
    assert "optimizer=" not in str(refused.value) and "--opt" in str(refused.value)


def test_discovery_imports_no_library():
    import subprocess
    import sys

    code = (
        "import sys, torch, torchmagic\n"
        "class Learner: pass\n"
        "l = Learner(); l.model = torch.nn.Linear(2, 2)\n"
        "l.opt = torch.optim.SGD(l.model.parameters(), lr=0.1)\n"
        "tm = torchmagic.Session(namespace={'l': l})\n"
        "tm.freeze('l.model'); tm.doctor()\n"
        "print(sorted(m for m in ('accelerate', 'lightning', 'peft', 'timm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
