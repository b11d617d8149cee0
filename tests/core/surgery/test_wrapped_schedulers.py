"""Schedulers built on a wrapped optimizer: a schedule made after
``accelerator.prepare`` on the ``AcceleratedOptimizer`` (as Accelerate's examples and
``transformers.Trainer`` do), itself prepared into an ``AcceleratedScheduler``, drives the
optimizer inside. ``%unfreeze … lr=`` keeps it in step: the next ``scheduler.step()``
works and the lrs and weights match the same edit done by hand, bit for bit."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

from torchmagic import Session

accelerate = pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")


def _tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            layer1=nn.Linear(6, 8), act=nn.ReLU(), layer4=nn.Linear(8, 8), fc=nn.Linear(8, 3)
        )
    )


def _prepared(schedule) -> dict:
    """model, optimizer and a schedule built on the prepared optimizer, then prepared."""
    accelerator = accelerate.Accelerator(cpu=True)
    model = _tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    scheduler = accelerator.prepare(schedule(optimizer))
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "acc": accelerator}


def _steps(ns: dict, n: int) -> None:
    torch.manual_seed(3)
    for _ in range(n):
        ns["optimizer"].zero_grad()
        ns["model"](torch.randn(4, 6)).sum().backward()
        ns["optimizer"].step()
        ns["scheduler"].step()


def _by_hand(ns: dict, lr: float) -> None:
    """``freeze model --except fc`` then ``unfreeze layer4 lr=`` in plain PyTorch."""
    model, inner = ns["model"], ns["scheduler"].scheduler
    opt = ns["optimizer"].optimizer
    frozen = [p for n, p in model.named_parameters() if not n.startswith("fc")]
    head = opt.param_groups[0]
    head["params"] = [p for p in head["params"] if all(p is not q for q in frozen)]
    for p in frozen:
        opt.state.pop(p, None)
        p.requires_grad_(False)
        p.grad = None
    layer4 = list(model.layer4.parameters())
    for p in layer4:
        p.requires_grad_(True)
    ref = head["initial_lr"]
    group = {k: v for k, v in head.items() if k not in ("params", "lr", "initial_lr")}
    opt.add_param_group(
        {**group, "params": layer4, "lr": lr * (head["lr"] / ref), "initial_lr": lr / ref * ref}
    )
    inner.base_lrs.append(inner.base_lrs[0] / ref * lr)
    inner.lr_lambdas.append(inner.lr_lambdas[0])
    inner._last_lr = [g["lr"] for g in opt.param_groups]


@pytest.mark.parametrize(
    "schedule",
    [
        lambda opt: transformers.get_linear_schedule_with_warmup(opt, 2, 20),
        lambda opt: transformers.get_cosine_schedule_with_warmup(opt, 2, 20),
        lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.9**step),
    ],
    ids=["hf-linear", "hf-cosine", "torch-lambda"],
)
def test_a_schedule_made_on_the_accelerated_optimizer_follows_a_new_group(schedule):
    ns, twin = _prepared(schedule), _prepared(schedule)
    _steps(ns, 3)
    _steps(twin, 3)
    tm = Session(namespace=ns)
    tm.freeze("model", exclude=["fc"])
    change = tm.unfreeze("layer4", lr=1e-4)
    _by_hand(twin, 1e-4)
    inner = ns["scheduler"].scheduler
    assert change.groups[1].schedulers == ("LambdaLR `scheduler`",)
    assert inner.base_lrs == twin["scheduler"].scheduler.base_lrs
    assert len(inner.lr_lambdas) == len(ns["optimizer"].param_groups) == 2
    _steps(ns, 4)  # a missed per-group list fails here (torch zips them with strict=True)
    _steps(twin, 4)
    ours = [g["lr"] for g in ns["optimizer"].param_groups]
    assert ours == [g["lr"] for g in twin["optimizer"].param_groups]
    assert ns["optimizer"].param_groups[1]["initial_lr"] == 1e-4
    theirs = twin["model"].parameters()
    for (name, p), q in zip(ns["model"].named_parameters(), theirs, strict=True):
        assert torch.equal(p, q), name


def test_the_doctor_sees_a_wrapped_schedule_out_of_step_and_does_not_blame_a_recreation():
    ns = _prepared(lambda opt: transformers.get_linear_schedule_with_warmup(opt, 2, 20))
    assert not [f for f in Session(namespace=ns).doctor().findings if f.check == "scheduler"]
    ns["optimizer"].add_param_group({"params": [nn.Parameter(torch.zeros(2))], "lr": 1e-3})
    findings = [f for f in Session(namespace=ns).doctor().findings if f.check == "scheduler"]
    assert [f.severity for f in findings] == ["error"]
    assert "LambdaLR" in findings[0].subject and "recreated" not in findings[0].message
