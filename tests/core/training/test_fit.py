from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as S
from torch.utils.data import DataLoader, TensorDataset

from builders import blobs
from torchmagic import Session, TorchMagicError
from torchmagic.core.training.fit_events import StopReason


def mlp(classes=4):
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            body=nn.Linear(8, 16), act=nn.ReLU(), norm=nn.BatchNorm1d(16), fc=nn.Linear(16, classes)
        )
    )


def loaders(batch=20):
    x, y = blobs(200)
    train = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True)
    val = DataLoader(TensorDataset(*blobs(60, seed=0)), batch_size=30)
    return train, val


def test_loss_decreases_to_a_known_level():
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train, val = loaders()
    history = Session(model, opt).fit(train, val=val, epochs=5)
    first, last = history.epochs[0], history.epochs[-1]
    assert last.train_loss < 0.5 * first.train_loss
    assert last.val_accuracy > 0.9
    assert history.steps == 5 * len(train) and history.stopped is None
    assert history.samples == 5 * 200


def test_keyboard_interrupt_stops_after_the_batch():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train, _ = loaders()

    def interrupted():
        for i, batch in enumerate(train):
            if i == 3:
                raise KeyboardInterrupt
            yield batch

    model.eval()
    history = Session(model, opt).fit(interrupted(), epochs=2)
    assert history.steps == 3 and history.stop_reason is StopReason.INTERRUPTED
    assert "step is 3" in history.stopped
    assert all(p.grad is None for p in model.parameters())
    assert not model.training  # mode restored
    opt.state_dict()


PER_BATCH = {
    "OneCycleLR": lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=100),
    "CyclicLR": lambda o: S.CyclicLR(o, 0.01, 0.1, step_size_up=5),
}
PER_EPOCH = {
    "StepLR": lambda o: S.StepLR(o, 1),
    "CosineAnnealingLR": lambda o: S.CosineAnnealingLR(o, 10),
    "SequentialLR": lambda o: S.SequentialLR(
        o, [S.ConstantLR(o, 0.5, total_iters=1), S.ExponentialLR(o, 0.9)], [1]
    ),
}


@pytest.mark.parametrize("name", sorted(PER_BATCH) + sorted(PER_EPOCH))
def test_scheduler_stepping(name):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = {**PER_BATCH, **PER_EPOCH}[name](opt)
    start = sched.last_epoch
    train, _ = loaders()
    Session(model, opt, schedulers=[sched]).fit(train, epochs=2)
    expected = 2 * len(train) if name in PER_BATCH else 2
    assert sched.last_epoch - start == expected


def test_reduce_on_plateau_reads_the_validation_loss():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = S.ReduceLROnPlateau(opt)
    train, val = loaders()
    history = Session(model, opt, schedulers=[sched]).fit(train, val=val, epochs=2)
    assert sched.best == min(m.val_loss for m in history.epochs)


def test_validation_runs_in_eval_without_grad_and_frozen_bn_stays():
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append((self.training, torch.is_grad_enabled()))
            return x

    model = mlp()
    model.add_module("probe", Probe())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    tm = Session(model, opt)
    tm.freeze("norm")
    stats = model.norm.running_mean.clone()
    train, val = loaders()
    tm.fit(train, val=val, epochs=1)
    assert seen[0] == (True, True) and seen[-1] == (False, False)
    assert torch.equal(model.norm.running_mean, stats)  # frozen BN held in eval in %fit
    assert model.training


def test_max_steps_and_refusals():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    train, _ = loaders()
    tm = Session(model, opt)
    history = tm.fit(train, epochs=3, max_steps=4)
    assert history.steps == 4 and history.stopped == "reached max_steps=4"
    assert history.stop_reason is StopReason.MAX_STEPS
    with pytest.raises(TorchMagicError, match="^epochs must be at least 1"):
        tm.fit(train, epochs=0)
    with pytest.raises(TorchMagicError, match="unknown loss"):
        tm.fit(train, loss="nope")
    with pytest.raises(TorchMagicError, match="no optimizer holds"):
        Session(mlp()).fit(train)
    assert len(tm.fits) == 1


def test_bf16_training_on_the_cpu():
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tm = Session(model, opt)
    tm.amp_on("bf16")  # explicit: "auto" keeps fp32 on a CPU without bf16 instructions
    train, val = loaders()
    history = tm.fit(train, val=val, epochs=3)
    assert history.precision == "bf16"
    assert history.epochs[-1].train_loss < history.epochs[0].train_loss
    assert model.fc.weight.dtype is torch.float32  # autocast, never model.half()
