"""fastai's ``Learner``: before the first fit ``learn.opt`` is None and fit builds it over
the parameters that train then, so the edits need nothing more; with
``OptimWrapper`` the command edits the torch optimizer inside, and the next ``learn.fit``
trains bit for bit as after the same edit by hand; fastai's own ``Optimizer`` keeps param
lists torchmagic does not edit, so a command that would leave them behind is refused in
one line naming ``learn.opt``, nothing changed. An lr= that ``fit`` would overwrite is
refused, naming the Learner. The doctor sees a head ``learn.opt`` does not hold."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from torchmagic import Session
from torchmagic.core.errors import TorchMagicError

pytest.importorskip("fastai")

from fastai.data.core import DataLoaders  # noqa: E402
from fastai.data.load import DataLoader  # noqa: E402
from fastai.learner import Learner  # noqa: E402
from fastai.optimizer import Adam, OptimWrapper  # noqa: E402

WRAPPED = partial(OptimWrapper, opt=torch.optim.Adam)


def learner(opt_func=Adam) -> Learner:
    torch.manual_seed(0)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    items = list(zip(x, y, strict=True))
    dls = DataLoaders(DataLoader(items, bs=4), DataLoader(items, bs=4), device="cpu")
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return Learner(dls, model, loss_func=nn.CrossEntropyLoss(), opt_func=opt_func, lr=1e-2)


def fit(learn: Learner) -> None:
    with learn.no_logging():
        learn.fit(1)


def new_head_like(ours: Learner, hand: Learner) -> None:
    """By hand: a fresh head with the very weights the command gave ours."""
    head = nn.Linear(8, 3)
    head.load_state_dict(ours.model[2].state_dict())
    hand.model[2] = head


def same_models(a: Learner, b: Learner) -> None:
    theirs = dict(b.model.named_parameters())
    for name, p in a.model.named_parameters():
        assert torch.equal(p, theirs[name]), name
        assert p.requires_grad == theirs[name].requires_grad, name


def torch_groups(learn: Learner) -> list[tuple[list[str], dict]]:
    """Each torch group of ``learn.opt`` as (parameter names, hyper-parameters)."""
    names = {id(p): n for n, p in learn.model.named_parameters()}
    return [
        ([names[id(p)] for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
        for g in learn.opt.opt.param_groups
    ]


def torch_state(learn: Learner) -> dict[str, dict]:
    names = {id(p): n for n, p in learn.model.named_parameters()}
    return {names[id(p)]: s for p, s in learn.opt.opt.state.items()}


def same_state(a: dict[str, dict], b: dict[str, dict]) -> None:
    assert a.keys() == b.keys()
    for name, state in a.items():
        assert state.keys() == b[name].keys(), name
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b[name][key])), name


def snapshot(learn: Learner) -> tuple:
    """Weights, flags, fastai's param lists, hypers and state, as they are."""
    model = {n: (p.detach().clone(), p.requires_grad) for n, p in learn.model.named_parameters()}
    lists = [[id(p) for p in pg] for pg in learn.opt.param_lists]
    state = {
        id(p): {k: torch.as_tensor(v).clone() for k, v in s.items()}
        for p, s in learn.opt.state.items()
    }
    return model, lists, [dict(h) for h in learn.opt.hypers], state, learn.model[2]


def assert_unchanged(learn: Learner, before: tuple) -> None:
    model, lists, hypers, state, head = snapshot(learn)
    assert learn.model[2] is before[4] and lists == before[1] and hypers == before[2]
    for name, (value, flag) in model.items():
        assert torch.equal(value, before[0][name][0]) and flag == before[0][name][1], name
    assert state.keys() == before[3].keys()
    for key, entries in state.items():
        assert all(torch.equal(v, before[3][key][k]) for k, v in entries.items())


def test_before_the_first_fit_the_new_head_trains_as_by_hand():
    ours, hand = learner(), learner()
    tm = Session(namespace={"learn": ours})
    change = tm.replace_head("learn.model.2", 3)
    assert any(n.startswith("`learn` has no optimizer yet") for n in change.effect.notes)
    new_head_like(ours, hand)
    fit(ours)
    fit(hand)
    held = {id(p) for pg in ours.opt.param_lists for p in pg}
    assert {id(p) for p in ours.model[2].parameters()} <= held
    same_models(ours, hand)


def test_freeze_before_the_first_fit_leaves_the_frozen_out_of_the_optimizer_fit_builds():
    ours, hand = learner(), learner()
    Session(namespace={"learn": ours}).freeze("learn.model.0")
    hand.model[0].requires_grad_(False)
    fit(ours)
    fit(hand)
    assert [len(pg) for pg in ours.opt.param_lists] == [len(pg) for pg in hand.opt.param_lists]
    same_models(ours, hand)


@pytest.mark.parametrize(
    "command",
    [
        lambda tm: tm.replace_head("learn.model.2", 3),
        lambda tm: tm.freeze("learn.model.0"),
        lambda tm: tm.unfreeze("learn.model.0"),
        lambda tm: tm.unfreeze("learn.model.0", lr=1e-3),
        lambda tm: tm.replace_head("learn.model.2", 3, dry_run=True),
    ],
    ids=["replace_head", "freeze", "unfreeze", "unfreeze-lr", "dry-run"],
)
def test_fastais_own_optimizer_is_refused_in_one_line_nothing_changed(command):
    learn = learner()
    fit(learn)
    before = snapshot(learn)
    tm = Session(namespace={"learn": learn})
    with pytest.raises(TorchMagicError) as refused:
        command(tm)
    text = str(refused.value)
    assert "\n" not in text and text.startswith("`learn.opt` is fastai's own Optimizer")
    assert "learn.opt = None" in text and "OptimWrapper" in text
    assert_unchanged(learn, before)


def test_the_advice_holds_learn_opt_none_then_the_new_head_trains():
    learn = learner()
    fit(learn)
    learn.opt = None
    Session(namespace={"learn": learn}).replace_head("learn.model.2", 3)
    fit(learn)
    held = {id(p) for pg in learn.opt.param_lists for p in pg}
    assert {id(p) for p in learn.model[2].parameters()} <= held


def test_with_optim_wrapper_replace_head_then_fit_is_as_by_hand():
    ours, hand = learner(WRAPPED), learner(WRAPPED)
    fit(ours)
    fit(hand)
    old = list(ours.model[2].parameters())
    change = Session(namespace={"learn": ours}).replace_head("learn.model.2", 3)
    assert change.optimizer_name == "learn.opt"
    # by hand: the new head takes the old one's places in its group, the old state goes
    new_head_like(ours, hand)
    group = hand.opt.opt.param_groups[0]
    gone = group["params"][2:]
    group["params"] = group["params"][:2] + list(hand.model[2].parameters())
    for p in gone:
        del hand.opt.opt.state[p]
    assert torch_groups(ours) == torch_groups(hand)
    assert all(p not in ours.opt.opt.state for p in old)
    same_state(torch_state(ours), torch_state(hand))
    fit(ours)
    fit(hand)
    same_models(ours, hand)
    assert torch_groups(ours) == torch_groups(hand)
    same_state(torch_state(ours), torch_state(hand))


def test_with_optim_wrapper_freeze_and_unfreeze_then_fit_are_as_by_hand():
    ours, hand = learner(WRAPPED), learner(WRAPPED)
    fit(ours)
    fit(hand)
    tm = Session(namespace={"learn": ours})
    tm.freeze("learn.model.0")
    fit(ours)
    # by hand: off requires_grad, out of the group, its state dropped (the session
    # keeps it for undo only); unfreezing starts it afresh
    group = hand.opt.opt.param_groups[0]
    body = list(hand.model[0].parameters())
    for p in body:
        del hand.opt.opt.state[p]
    for p in body:
        p.requires_grad_(False)
        p.grad = None
    group["params"] = [p for p in group["params"] if all(p is not b for b in body)]
    fit(hand)
    same_models(ours, hand)
    assert torch_groups(ours) == torch_groups(hand)
    same_state(torch_state(ours), torch_state(hand))
    tm.unfreeze("learn.model.0")
    for p in body:
        p.requires_grad_(True)
    group["params"] = group["params"] + body  # back in the home group, appended
    assert torch_groups(ours) == torch_groups(hand)
    same_state(torch_state(ours), torch_state(hand))
    fit(ours)
    fit(hand)
    same_models(ours, hand)


def test_an_lr_that_fit_overwrites_is_refused_naming_the_learner():
    learn = learner(WRAPPED)
    fit(learn)
    tm = Session(namespace={"learn": learn})
    tm.freeze("learn.model.0")
    groups = torch_groups(learn)
    with pytest.raises(TorchMagicError) as refused:
        tm.unfreeze("learn.model.0", lr=1e-4)
    text = str(refused.value)
    assert "\n" not in text and "`learn` (Learner) sets every group's lr at each fit" in text
    assert torch_groups(learn) == groups
    assert not any(p.requires_grad for p in learn.model[0].parameters())


def test_the_doctor_sees_a_head_replaced_by_hand_that_learn_opt_does_not_hold():
    learn = learner()
    fit(learn)
    tm = Session(namespace={"learn": learn})
    assert not [f for f in tm.doctor().findings if f.check == "library-out-of-step"]
    learn.model[2] = nn.Linear(8, 3)
    (finding,) = [f for f in tm.doctor().findings if f.check == "library-out-of-step"]
    assert finding.subject == "learn" and "learn.fit never updates them" in finding.message
    assert "2.weight, 2.bias" in finding.message and "learn.opt = None" in str(finding.advice)


def test_bn_train_keeps_the_normalization_weights_training_as_fastais_freeze():
    """fastai's train_bn: ``learn.freeze()`` keeps the BatchNorm weights and biases of the
    frozen body trainable (resnet18 with a 3-class head: 11,139 trainable); the freeze
    with bn="train" trains exactly the same tensors."""
    import torchvision

    def build() -> nn.Module:
        torch.manual_seed(0)
        return torchvision.models.resnet18(num_classes=3)

    theirs = build()
    items = [(torch.randn(3, 32, 32), torch.tensor(0)) for _ in range(4)]
    dls = DataLoaders(DataLoader(items, bs=2), DataLoader(items, bs=2), device="cpu")
    body = [p for n, p in theirs.named_parameters() if not n.startswith("fc.")]
    learn = Learner(
        dls,
        theirs,
        loss_func=nn.CrossEntropyLoss(),
        splitter=lambda m: [body, list(m.fc.parameters())],
    )
    learn.create_opt()
    learn.freeze()
    fastai_trains = {n for n, p in theirs.named_parameters() if p.requires_grad}
    assert sum(p.numel() for p in theirs.parameters() if p.requires_grad) == 11_139

    ours = build()
    opt = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    change = Session(ours, opt).freeze(exclude=["fc"], bn="train")
    assert {n for n, p in ours.named_parameters() if p.requires_grad} == fastai_trains
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    assert held == {id(p) for p in ours.parameters() if p.requires_grad}
    assert any("fastai's train_bn" in n for n in change.effect.notes)
