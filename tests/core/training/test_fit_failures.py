"""Training failures leave a clean state, and a fit that cannot train is refused before
its first step; the non-finite-loss stop without a per-step sync."""

import itertools
import os
import signal

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from test_fit import loaders, mlp
from torchmagic import Session, TorchMagicError
from torchmagic.core.training import fit as fit_module
from torchmagic.core.training.fit_events import StopReason


@pytest.fixture
def clock(monkeypatch):
    """The loop's clock advances ``clock.tick`` seconds per reading: check points come
    at a known cadence instead of by wall time (0: only at epoch ends)."""

    class Clock:
        tick = 0.0
        now = 0.0

        def __call__(self) -> float:
            self.now += self.tick
            return self.now

    fake = Clock()
    monkeypatch.setattr(fit_module, "perf_counter", fake)
    return fake


def nan_at(step: int):
    calls = itertools.count(1)

    def loss(output, target):
        value = nn.functional.cross_entropy(output, target)
        return value * float("nan") if next(calls) == step else value

    return loss


def bn_after_each_step(model, opt):
    """running_mean after every optimizer step, by step number."""
    seen = {}
    opt.register_step_post_hook(
        lambda o, a, k: seen.__setitem__(len(seen) + 1, model.norm.running_mean.clone())
    )
    return seen


def test_nan_found_at_the_epoch_end_restores_batchnorm_and_names_the_damage(clock):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in model.norm.named_buffers()}
    train, _ = loaders()
    tm = Session(namespace={"model": model, "optimizer": opt, "weird": nan_at(3)})
    history = tm.fit(train, loss="weird", epochs=3)
    # no check point inside the epoch (the clock stands still): found at its end
    assert history.stop_reason is StopReason.NON_FINITE_LOSS
    assert history.steps == len(train) and "nan at step 3" in history.stopped
    assert f"stopped after step {len(train)}" in history.stopped
    for key, value in model.norm.named_buffers():  # NaN from step 4's forward on
        assert torch.equal(value, before[key]), key  # back to the copy from before step 1
    damaged = sum(not torch.isfinite(p).all() for p in model.parameters())
    assert damaged > 0 and f"{damaged} of 6 trainable parameter tensors" in history.stopped
    assert "restored to step 0" in history.stopped
    assert all(p.grad is None for p in model.parameters())
    (epoch,) = history.epochs
    assert epoch.val_loss is None and epoch.train_loss == epoch.train_loss  # finite steps 1-2


def test_nan_found_at_the_next_check_point_restores_the_last_good_batchnorm(clock):
    clock.tick = 1.0  # every step is a check point
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = bn_after_each_step(model, opt)
    train, _ = loaders()
    tm = Session(namespace={"model": model, "optimizer": opt, "weird": nan_at(3)})
    history = tm.fit(train, loss="weird", epochs=2)
    assert history.steps == 3 and "nan at step 3; stopped after step 3" in history.stopped
    assert "restored to step 2" in history.stopped
    assert torch.equal(model.norm.running_mean, stats[2])
    assert not torch.equal(stats[3], stats[2])  # step 3's forward had moved them


def test_with_a_grad_scaler_the_nan_step_is_skipped_and_weights_stay_finite(clock):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tm = Session(namespace={"model": model, "optimizer": opt, "weird": nan_at(2)})
    tm.amp_on("bf16")
    tm.amp.scaler = torch.amp.GradScaler("cpu")  # the logic of fp16 + GradScaler
    train, _ = loaders()
    history = tm.fit(train, loss="weird", epochs=1)
    assert history.stop_reason is StopReason.NON_FINITE_LOSS
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert "weights and optimizer state are finite (the GradScaler" in history.stopped


def test_a_failing_optimizer_step_leaves_no_gradients():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = itertools.count(1)

    def fail_on_second_step(optimizer, args, kwargs):
        if next(steps) == 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    opt.register_step_pre_hook(fail_on_second_step)
    model.eval()
    train, _ = loaders()
    with pytest.raises(RuntimeError, match="illegal memory access"):
        Session(model, opt).fit(train)
    assert all(p.grad is None for p in model.parameters())
    assert not model.training


def _unchanged(model, opt, call, match, param):
    before = [p.detach().clone() for p in model.parameters()]
    stats = model.norm.running_mean.clone()
    with pytest.raises(TorchMagicError, match=match) as error:
        call()
    assert error.value.param == param
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert torch.equal(stats, model.norm.running_mean) and not opt.state


@pytest.mark.parametrize(
    "val, match",
    [
        ([(torch.randn(4, 8), torch.zeros(4, dtype=torch.long), 0)], "a tuple of 3"),
        ([torch.randn(4, 8)], "got a Tensor"),
        (DataLoader(TensorDataset(torch.randn(8, 8)), batch_size=4), "a list of 1"),
        ([], "val has no batches"),
        (torch.randn(4, 8), "not a Tensor"),
    ],
)
def test_a_val_that_is_not_batches_of_pairs_fails_before_any_step(val, match):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train, _ = loaders()
    tm = Session(model, opt)
    _unchanged(model, opt, lambda: tm.fit(train, val=val), match, "val")


@pytest.mark.parametrize(
    "train, match",
    [
        (torch.randn(20, 8), "train must be a DataLoader .* not a Tensor"),
        ({"x": torch.randn(4, 8)}, "not a dict"),
        ([(torch.randn(4, 8),)], "a tuple of 1"),
    ],
)
def test_a_train_that_is_not_a_loader_is_one_error(train, match):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _unchanged(model, opt, lambda: Session(model, opt).fit(train), match, "train")


def test_a_one_shot_iterator_of_bad_batches_fails_at_its_first_batch():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batches = iter([(torch.randn(4, 8),)])
    _unchanged(model, opt, lambda: Session(model, opt).fit(batches), "a tuple of 1", "train")


@pytest.mark.parametrize("name", ["exit", "get_ipython", "print", "_hidden", "nn_class"])
def test_only_loss_names_and_user_callables_are_losses(name, ip):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    namespace = {**ip.user_ns, "model": model, "optimizer": opt}
    namespace.update(print=print, _hidden=nn.functional.mse_loss, nn_class=nn.MSELoss)
    train, _ = loaders()
    tm = Session(namespace=namespace)
    match = "is a class" if name == "nn_class" else "unknown loss"
    _unchanged(model, opt, lambda: tm.fit(train, loss=name), match, "loss")


def test_user_losses_are_accepted():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train, _ = loaders()

    def my_loss(output, target):
        return nn.functional.cross_entropy(output, target)

    tm = Session(
        namespace={
            "model": model,
            "optimizer": opt,
            "my_loss": my_loss,
            "criterion": nn.CrossEntropyLoss(),
        }
    )
    assert tm.fit(train, model="model", loss="my_loss", max_steps=1).steps == 1
    assert tm.fit(train, model="model", loss="criterion", max_steps=1).steps == 1


def test_bad_sched_step_is_refused():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train, _ = loaders()
    tm = Session(model, opt)
    _unchanged(model, opt, lambda: tm.fit(train, sched_step="step"), "sched_step", "sched_step")


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def ctrl_c_on_call(n: int):
    """Cross-entropy that presses Ctrl-C during its ``n``-th call (mid-step)."""
    calls = itertools.count(1)

    def loss(output, target):
        if next(calls) == n:
            ctrl_c()
        return nn.functional.cross_entropy(output, target)

    return loss


def test_ctrl_c_mid_step_finishes_that_step_and_stops():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss = ctrl_c_on_call(3)
    train, _ = loaders()
    tm = Session(namespace={"model": model, "optimizer": opt, "loss": loss})
    history = tm.fit(train, loss="loss", epochs=2)
    assert history.steps == 3 and history.stop_reason is StopReason.INTERRUPTED
    assert len(opt.state) == 6  # the step that saw Ctrl-C completed, momentum and all


def test_the_progress_summary_of_an_interrupted_run_says_it_stopped():
    """`history = %fit …` shows only the progress summary: a run cut by Ctrl-C in its
    first epoch must not read as one epoch done and nothing else."""
    from torchmagic import render

    drawn = []

    class Handle:
        def update(self, rendered):
            drawn.append(rendered)

    def show(rendered):
        drawn.append(rendered)
        return Handle()

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = ctrl_c_on_call(2)
    train, _ = loaders()
    tm = Session(namespace={"model": model, "optimizer": opt, "loss": loss})
    history = tm.fit(train, loss="loss", epochs=2, observer=render.NotebookProgress(show, 200))
    assert history.steps == 2 < len(train)
    last = str(drawn[-1]).splitlines()[-1]
    assert last.endswith(
        "· stopped: interrupted; the last completed step is 2; epoch 1 was cut after 2 of "
        f"{len(train)} batches"
    )


def test_ctrl_c_during_validation_trains_no_further_step():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train, val = loaders()

    def interrupting_val():
        ctrl_c()
        yield from val

    class Val:
        def __iter__(self):
            return interrupting_val()

    history = Session(model, opt).fit(train, val=Val(), epochs=3)
    assert history.steps == len(train) and history.stop_reason is StopReason.INTERRUPTED
    assert history.epochs[0].val_loss is not None


def test_the_python_api_takes_the_loss_object_itself():
    """``tm.fit(train, loss=criterion)`` as a script writes it; a class or a non-callable
    is one clear refusal that changes nothing."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train, _ = loaders()
    tm = Session(model, opt)
    assert tm.fit(train, loss=nn.CrossEntropyLoss(), max_steps=1).steps == 1
    _unchanged(model, opt, lambda: tm.fit(train, loss=nn.CrossEntropyLoss), "a class", "loss")
    _unchanged(model, opt, lambda: tm.fit(train, loss=3), "name or a loss function", "loss")


def test_a_loss_no_trainable_parameter_made_is_refused_before_any_step():
    """Only an unused layer trains (as LoRA adapters switched off do): one line, not
    torch's backward traceback, and the statistics the forward moved are put back."""
    model = mlp()
    model.requires_grad_(False)
    model.norm.spare = nn.Parameter(torch.zeros(2))  # BatchNorm's forward never reads it
    opt = torch.optim.SGD([model.norm.spare], lr=0.1)
    train, _ = loaders()
    _unchanged(model, opt, lambda: Session(model, opt).fit(train), "nothing in .* trains", None)
