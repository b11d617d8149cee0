"""Objects that set lrs or trainability on their own, and unknown holders named: an
ignite ParamScheduler refuses a new group by name, ignite's LRScheduler is seen through
to its torch scheduler, Lightning's fine-tuning callbacks and skorch nets are
named at the command, any other object holding the model or its optimizer is named, and
the doctor reports each before a command runs. Each case with the real library, compared
with the same edit by hand or a one-line refusal after which nothing changed."""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch
from torch import nn

from torchmagic import Session, TorchMagicError


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer1 = nn.Linear(6, 8)
        self.layer2 = nn.Linear(8, 8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.layer2(torch.relu(self.layer1(x)))))


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


def _snapshot(model: nn.Module, opt: torch.optim.Optimizer | None) -> tuple:
    """Weights, flags, groups (their parameters by name, their hyper-parameters) and
    state by name: comparable across a model and its copy edited by hand."""
    weights = [(n, p.detach().clone(), p.requires_grad) for n, p in model.named_parameters()]
    name = {id(p): n for n, p in model.named_parameters()}
    groups, state = [], []
    if opt is not None:
        groups = [
            ([name[id(p)] for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
            for g in opt.param_groups
        ]
        state = [
            (name[id(p)], {k: v.clone() for k, v in s.items() if isinstance(v, torch.Tensor)})
            for p, s in opt.state.items()
        ]
    return weights, groups, state


def _same(a: tuple, b: tuple) -> bool:
    (wa, ga, sa), (wb, gb, sb) = a, b
    weights = len(wa) == len(wb) and all(
        na == nb and torch.equal(ta, tb) and ra == rb
        for (na, ta, ra), (nb, tb, rb) in zip(wa, wb, strict=True)
    )
    state = len(sa) == len(sb) and all(
        ia == ib and da.keys() == db.keys() and all(torch.equal(da[k], db[k]) for k in da)
        for (ia, da), (ib, db) in zip(sa, sb, strict=True)
    )
    return weights and ga == gb and state


def _trained(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """One step, so the optimizer has state to keep."""
    torch.manual_seed(2)
    opt.zero_grad()
    model(torch.randn(4, 6)).sum().backward()
    opt.step()


def _by_hand_freeze_all_but_fc(model: Net, opt: torch.optim.Optimizer) -> None:
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("fc."))
    for g in opt.param_groups:
        g["params"] = [p for p in g["params"] if p.requires_grad]


# -- ignite ----------------------------------------------------------------------------


def _engine(model: nn.Module, opt: torch.optim.Optimizer):
    ignite = pytest.importorskip("ignite.engine")

    def step(engine, batch):
        opt.zero_grad()
        model(batch).sum().backward()
        opt.step()

    return ignite.Engine(step)


def _batches() -> list[torch.Tensor]:
    torch.manual_seed(3)
    return [torch.randn(4, 6) for _ in range(4)]


@pytest.mark.parametrize(
    ("bound", "every"),
    [(False, None), (True, None), (False, 2)],
    ids=["attached", "bound", "filtered"],
)
def test_ignite_param_scheduler_refuses_a_new_group_by_name(bound, every):
    param_scheduler = pytest.importorskip("ignite.handlers.param_scheduler")
    from ignite.engine import Events

    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = _engine(model, opt)
    handler = param_scheduler.CosineAnnealingScheduler(opt, "lr", 0.1, 0.001, cycle_size=4)
    event = Events.ITERATION_STARTED if every is None else Events.ITERATION_STARTED(every=every)
    trainer.add_event_handler(event, handler)  # with a filter, ignite keeps a wrapper
    ns = {"model": model, "optimizer": opt, "trainer": trainer}
    if bound:
        ns["handler"] = handler
    tm = Session(namespace=ns)
    tm.freeze("model", exclude=["fc"])
    _trained(model, opt)
    before = _snapshot(model, opt)
    with pytest.raises(TorchMagicError) as refused:
        tm.unfreeze("layer2", lr=1e-3)
    text = str(refused.value)
    path = "handler" if bound else "trainer._event_handlers[Events.ITERATION_STARTED][0][0]"
    path += ".__wrapped__" if every else ""
    assert "\n" not in text and f"`{path}` (ignite CosineAnnealingScheduler)" in text
    assert "param_group_index" in text
    assert _same(before, _snapshot(model, opt))  # nothing changed


def test_ignite_param_scheduler_of_one_group_lets_a_new_group_in():
    param_scheduler = pytest.importorskip("ignite.handlers.param_scheduler")
    from ignite.engine import Events

    model, mirror = _net(), _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hand = torch.optim.SGD(mirror.parameters(), lr=0.1)
    for o, m in ((opt, model), (hand, mirror)):
        engine = _engine(m, o)
        handler = param_scheduler.LinearCyclicalScheduler(
            o, "lr", 0.1, 0.01, cycle_size=4, param_group_index=0
        )
        engine.add_event_handler(Events.ITERATION_STARTED, handler)
        if o is opt:
            trainer = engine
        else:
            by_hand = engine
    tm = Session(namespace={"model": model, "optimizer": opt, "trainer": trainer})
    tm.freeze("model", exclude=["fc"])
    tm.unfreeze("layer2", lr=1e-3)
    _by_hand_freeze_all_but_fc(mirror, hand)
    mirror.layer2.requires_grad_(True)
    hand.add_param_group({"params": list(mirror.layer2.parameters()), "lr": 1e-3})
    trainer.run(_batches(), max_epochs=1)
    by_hand.run(_batches(), max_epochs=1)
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in hand.param_groups]
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), mirror.parameters(), strict=True)
    )


def test_ignite_lr_scheduler_is_seen_through_and_kept_in_step():
    param_scheduler = pytest.importorskip("ignite.handlers.param_scheduler")
    from ignite.engine import Events

    model, mirror = _net(), _net()
    runs = []
    for m in (model, mirror):
        o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        inner = torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)
        engine = _engine(m, o)
        engine.add_event_handler(Events.ITERATION_STARTED, param_scheduler.LRScheduler(inner))
        runs.append((o, inner, engine))
    (opt, scheduler, trainer), (hand, hand_scheduler, by_hand) = runs
    tm = Session(namespace={"model": model, "optimizer": opt, "trainer": trainer})
    tm.freeze("model", exclude=["fc"])
    change = tm.unfreeze("layer2", lr=1e-3)
    assert not any("ignite" in n for n in change.effect.notes)
    _by_hand_freeze_all_but_fc(mirror, hand)
    mirror.layer2.requires_grad_(True)
    hand.add_param_group(
        {"params": list(mirror.layer2.parameters()), "lr": 1e-3, "initial_lr": 1e-3}
    )
    hand_scheduler.base_lrs.append(1e-3)
    hand_scheduler._last_lr.append(1e-3)
    assert scheduler.base_lrs == hand_scheduler.base_lrs
    trainer.run(_batches(), max_epochs=1)
    by_hand.run(_batches(), max_epochs=1)
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in hand.param_groups]
    assert opt.param_groups[1]["lr"] == 1e-3 * 0.5
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), mirror.parameters(), strict=True)
    )


# -- objects no integration knows -----------------------------------------------------


class Callback:
    """A user's own callback that sets lrs: torchmagic knows nothing of it."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer


def test_an_unknown_holder_is_named_by_a_command_that_changes_groups():
    model, mirror = _net(), _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hand = torch.optim.SGD(mirror.parameters(), lr=0.1)
    tm = Session(namespace={"model": model, "optimizer": opt, "warmup": Callback(opt)})
    frozen = tm.freeze("model", exclude=["fc"])
    line = "`warmup` (test_holders Callback) holds `optimizer` and may set its lrs"
    assert line in frozen.effect.notes
    change = tm.unfreeze("layer2", lr=1e-3)
    assert line in change.effect.notes
    _by_hand_freeze_all_but_fc(mirror, hand)
    mirror.layer2.requires_grad_(True)
    hand.add_param_group({"params": list(mirror.layer2.parameters()), "lr": 1e-3})
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in hand.param_groups]
    names = {id(p): n for n, p in model.named_parameters()}
    hand_names = {id(p): n for n, p in mirror.named_parameters()}
    assert [[names[id(p)] for p in g["params"]] for g in opt.param_groups] == [
        [hand_names[id(p)] for p in g["params"]] for g in hand.param_groups
    ]
    assert [p.requires_grad for p in model.parameters()] == [
        p.requires_grad for p in mirror.parameters()
    ]


def test_a_command_that_changes_nothing_names_no_holder():
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tm = Session(namespace={"model": model, "optimizer": opt, "warmup": Callback(opt)})
    change = tm.unfreeze("layer2")  # already trainable
    assert not any("warmup" in n for n in change.effect.notes)


# -- skorch ---------------------------------------------------------------------------


def _net_classifier():
    skorch = pytest.importorskip("skorch")
    net = skorch.NeuralNetClassifier(
        _net(),
        criterion=nn.CrossEntropyLoss,
        optimizer=torch.optim.SGD,
        lr=0.1,
        max_epochs=1,
        batch_size=4,
        train_split=None,
        verbose=0,
    )
    return net.initialize()


def _xy():
    torch.manual_seed(4)
    return torch.randn(8, 6), torch.randint(0, 3, (8,))


@pytest.mark.slow
def test_skorch_net_is_named_and_partial_fit_keeps_the_edit():
    net = _net_classifier()
    mirror = _net_classifier()
    tm = Session(namespace={"net": net})
    change = tm.freeze("net.module_.layer1")
    line = next(n for n in change.effect.notes if "skorch NeuralNetClassifier" in n)
    assert line.startswith("`net` (skorch NeuralNetClassifier) builds optimizer_ again")
    assert "partial_fit() keeps" in line
    mirror.module_.layer1.requires_grad_(False)  # the same edit by hand
    for g in mirror.optimizer_.param_groups:
        g["params"] = [p for p in g["params"] if p.requires_grad]
    assert _same(
        _snapshot(net.module_, net.optimizer_), _snapshot(mirror.module_, mirror.optimizer_)
    )
    x, y = _xy()
    kept = net.optimizer_
    net.partial_fit(x, y)
    mirror.partial_fit(x, y)
    assert net.optimizer_ is kept  # partial_fit keeps the edit
    assert _same(
        _snapshot(net.module_, net.optimizer_), _snapshot(mirror.module_, mirror.optimizer_)
    )
    net.fit(x, y)
    assert net.optimizer_ is not kept  # what the line warns of


# -- Lightning ------------------------------------------------------------------------


def _lightning(callback):
    lightning = pytest.importorskip("lightning.pytorch")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")

    class Lit(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.backbone = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
            self.head = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))

        def forward(self, x):
            return self.head(self.backbone(x))

        def training_step(self, batch, index):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            trainable = [p for p in self.parameters() if p.requires_grad]
            return torch.optim.SGD(trainable, lr=0.1)

    trainer = lightning.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback] if callback is not None else [],
    )
    return Lit(), trainer


def _loader():
    x, y = _xy()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


@pytest.mark.slow
def test_lightning_backbone_finetuning_is_named_and_the_refusal_is_not_circular():
    callbacks = pytest.importorskip("lightning.pytorch.callbacks")
    lit, trainer = _lightning(callbacks.BackboneFinetuning(unfreeze_backbone_at_epoch=5))
    trainer.fit(lit, _loader())
    tm = Session(namespace={"lit": lit, "trainer": trainer})
    opt = trainer.optimizers[0]
    hand = copy.deepcopy((lit, opt))  # the same edit by hand on a copy
    change = tm.freeze("lit.head.0")
    assert (
        "`trainer.callbacks[0]` (lightning BackboneFinetuning) freezes the module's backbone "
        "again at the next fit and adds it back as a param group at epoch 5"
    ) in " ".join(change.effect.notes)
    hand_lit, hand_opt = hand
    hand_lit.head[0].requires_grad_(False)
    for g in hand_opt.param_groups:
        g["params"] = [p for p in g["params"] if p.requires_grad]
    names = {id(p): n for n, p in lit.named_parameters()}
    hand_names = {id(p): n for n, p in hand_lit.named_parameters()}
    assert [[names[id(p)] for p in g["params"]] for g in opt.param_groups] == [
        [hand_names[id(p)] for p in g["params"]] for g in hand_opt.param_groups
    ]
    assert [p.requires_grad for p in lit.parameters()] == [
        p.requires_grad for p in hand_lit.parameters()
    ]
    before = _snapshot(lit, opt)
    with pytest.raises(TorchMagicError) as refused:
        tm.unfreeze("lit.backbone")  # frozen by the callback, in no group: no home
    text = str(refused.value)
    assert "\n" not in text and "trainer builds it again at every fit" in text
    assert "without lr=" in text and "unfreeze without lr=" not in text  # not circular
    assert _same(before, _snapshot(lit, opt))


def test_finetuning_scheduler_is_named_before_the_first_fit():
    fts = pytest.importorskip("finetuning_scheduler")
    lit, trainer = _lightning(fts.FinetuningScheduler())
    tm = Session(namespace={"lit": lit, "trainer": trainer})
    hand = copy.deepcopy(lit)
    change = tm.freeze("lit.head.0")
    hand.head[0].requires_grad_(False)
    assert [p.requires_grad for p in lit.parameters()] == [
        p.requires_grad for p in hand.parameters()
    ]
    line = next(n for n in change.effect.notes if "FinetuningScheduler" in n)
    assert "(finetuning_scheduler FinetuningScheduler) freezes all but" in line
    report = Session(namespace={"lit": lit, "trainer": trainer}).doctor()
    assert any(f.check == "holder" and "FinetuningScheduler" in f.message for f in report.findings)


# -- the doctor, before any command ------------------------------------------------------


def test_doctor_reports_each_holder_before_any_command():
    param_scheduler = pytest.importorskip("ignite.handlers.param_scheduler")
    from ignite.engine import Events

    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = _engine(model, opt)
    handler = param_scheduler.CosineAnnealingScheduler(opt, "lr", 0.1, 0.001, cycle_size=4)
    trainer.add_event_handler(Events.ITERATION_STARTED, handler)
    ns = {"model": model, "optimizer": opt, "trainer": trainer, "warmup": Callback(opt)}
    before = _snapshot(model, opt)
    found = {f.subject: f for f in Session(namespace=ns).doctor().findings if f.check == "holder"}
    ignite_finding = found["trainer._event_handlers[Events.ITERATION_STARTED][0][0]"]
    assert ignite_finding.severity == "warning" and "refuse" in ignite_finding.message
    assert (
        found["warmup"].message
        == "`warmup` (test_holders Callback) holds `optimizer` and may set its lrs"
    )
    assert _same(before, _snapshot(model, opt))  # the doctor changes nothing
