"""Gradient accumulation and clipping: ``fit(accumulate=N, clip=…)``, ``%fit --accum N
--clip NORM``, ``Session.step(…, accumulate=N)`` and ``%gpumem batch --effective-batch``.

Each run is compared bit for bit with the hand-written loop doing the same arithmetic
(Lightning's ``accumulate_grad_batches``: loss / N, a step every N batches and on the
epoch's last batch; per-batch schedulers stepped per optimizer step)."""

from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchmagic import Session, TorchMagicError
from torchmagic.core.devices.batch_size import accumulation_for
from torchmagic.core.training.amp import Accumulation, AmpController


def data(n=80, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(3, 6, generator=g) * 3
    y = torch.randint(0, 3, (n,), generator=g)
    return centers[y] + torch.randn(n, 6, generator=g), y


def build(batches=10, batch_size=8):
    """A tiny model with BatchNorm, SGD with momentum, a shuffling loader."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = data(batches * batch_size)
    train = DataLoader(
        TensorDataset(x, y),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(1),
    )
    return model, opt, train


def hand_written(model, opt, train, epochs, every, clip=None, sched=None, scaler=None):
    """The reference loop; returns the optimizer steps it made."""
    steps = 0
    model.train()
    for _ in range(epochs):
        for i, (x, y) in enumerate(train):
            loss = F.cross_entropy(model(x), y) / every
            (scaler.scale(loss) if scaler is not None else loss).backward()
            if (i + 1) % every and i + 1 != len(train):
                continue
            if clip is not None:
                if scaler is not None:
                    scaler.unscale_(opt)
                params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
                torch.nn.utils.clip_grad_norm_(params, clip)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
            if sched is not None:
                sched.step()
    return steps


def assert_same(model_a, opt_a, model_b, opt_b):
    a, b = model_a.state_dict(), model_b.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # weights and BatchNorm statistics
    for p, q in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(opt_a.state[p]["momentum_buffer"], opt_b.state[q]["momentum_buffer"])
    assert [g["lr"] for g in opt_a.param_groups] == [g["lr"] for g in opt_b.param_groups]


@pytest.mark.parametrize(
    "batches, every, clip",
    [
        (12, 4, None),  # whole windows (fastai's GradientAccumulation does the same)
        (10, 4, None),  # a last window of 2 batches steps, as in Lightning
        (10, 3, 0.5),  # with clipping
        (5, 1, 0.25),  # clipping alone
    ],
)
def test_fit_equals_the_hand_written_loop_bit_for_bit(batches, every, clip):
    per_epoch = -(-batches // every)
    model_a, opt_a, train_a = build(batches)
    sched_a = torch.optim.lr_scheduler.OneCycleLR(opt_a, max_lr=0.2, total_steps=2 * per_epoch)
    tm = Session(model_a, opt_a, schedulers=[sched_a])
    history = tm.fit(train_a, epochs=2, accumulate=every, clip=clip)

    model_b, opt_b, train_b = build(batches)
    sched_b = torch.optim.lr_scheduler.OneCycleLR(opt_b, max_lr=0.2, total_steps=2 * per_epoch)
    steps = hand_written(model_b, opt_b, train_b, 2, every, clip, sched_b)

    assert history.steps == steps == 2 * per_epoch
    assert sched_a.last_epoch == sched_b.last_epoch == steps  # stepped per optimizer step
    assert history.samples == 2 * batches * 8
    assert (history.accumulate, history.clip) == (every, clip)
    assert_same(model_a, opt_a, model_b, opt_b)
    assert all(p.grad is None for p in model_a.parameters())


def test_per_epoch_schedulers_still_step_once_per_epoch():
    model, opt, train = build(10)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    tm = Session(model, opt, schedulers=[sched])
    tm.fit(train, epochs=3, accumulate=4)
    assert sched.last_epoch == 3 and opt.param_groups[0]["lr"] == pytest.approx(0.1 / 8)


def test_max_steps_and_progress_count_optimizer_steps():
    class Recorder:
        refresh_seconds = 0.0

        def __init__(self):
            self.start, self.infos = None, []

        def on_start(self, start):
            self.start = start

        def on_step(self, info):
            self.infos.append(info)

        def on_validation_start(self, epoch, batches):
            pass

        def on_epoch(self, metrics):
            pass

        def on_unfreeze(self, event):
            pass

        def close(self):
            pass

    model, opt, train = build(10)
    recorder = Recorder()
    history = Session(model, opt).fit(train, epochs=1, accumulate=3, max_steps=2, observer=recorder)
    assert history.steps == 2 and history.samples == 6 * 8
    assert history.stop_reason.value == "max_steps"
    assert recorder.start.accumulate == 3
    infos = recorder.infos
    assert infos and all(i.batches == 4 for i in infos)  # ceil(10 / 3) steps per epoch
    assert [i.step for i in infos] == [i.batch for i in infos] and infos[-1].step <= 2


def test_max_steps_reached_by_the_partial_window_stops_after_it():
    model, opt, train = build(10)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    history = Session(model, opt, schedulers=[sched]).fit(
        train, epochs=2, accumulate=4, max_steps=3
    )
    assert history.steps == 3 and len(history.epochs) == 1 and history.samples == 80
    assert history.stop_reason.value == "max_steps"
    assert sched.last_epoch == 1  # the epoch was complete: its scheduler step ran


def test_a_non_finite_loss_names_the_optimizer_step_it_belongs_to():
    model, opt, train = build(10)
    calls = []

    def loss(output, targets):
        calls.append(1)
        value = F.cross_entropy(output, targets)
        return value * float("nan") if len(calls) == 5 else value  # batch 5: step 2 of 4

    history = Session(model, opt).fit(train, accumulate=3, loss=loss)
    assert history.stop_reason.value == "non_finite_loss"
    assert history.stopped.startswith("the loss became nan at step 2;")


def test_cached_features_accumulate_as_the_uncached_run():
    def probe(cache):
        model, opt, train = build(10)
        tm = Session(model, opt)
        tm.freeze(exclude=["3"])  # the head alone trains; BatchNorm held in eval
        history = tm.fit(train, epochs=2, accumulate=4, clip=0.5, cache_features=cache)
        return model[3].weight.detach().clone(), history

    w_plain, plain = probe(False)
    w_cached, cached = probe(True)
    assert cached.cached_features and plain.steps == cached.steps == 6
    assert torch.allclose(w_plain, w_cached, atol=1e-6)  # the head's inputs: two code paths


def test_an_interrupt_drops_the_open_window():
    model, opt, train = build(10)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    class Interrupting:
        """5 batches, then Ctrl-C: one step of 4, and 1 batch of the next window."""

        def __len__(self):
            return 10

        def __iter__(self):
            for i, batch in enumerate(train):
                if i == 5:
                    raise KeyboardInterrupt
                yield batch

    history = Session(model, opt).fit(Interrupting(), accumulate=4)
    assert history.steps == 1 and history.stop_reason.value == "interrupted"
    assert "the 1 batch accumulated since were dropped" in history.stopped
    assert all(p.grad is None for p in model.parameters())
    assert not torch.equal(model[0].weight, before["0.weight"])

    # the same as stopping the hand-written loop after its first step
    model_b, opt_b, train_b = build(10)
    model_b.train()
    for i, (x, y) in enumerate(train_b):
        (F.cross_entropy(model_b(x), y) / 4).backward()
        if i == 3:
            opt_b.step()
            opt_b.zero_grad(set_to_none=True)
        if i == 4:
            break
    assert torch.equal(model[0].weight, model_b[0].weight)


class _Fp32WithScaler(AmpController):
    """fp16's step logic (a GradScaler) without fp16 autocast, which the CPU refuses."""

    def __init__(self):
        super().__init__()
        self.enabled = True
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)

    def autocast(self, dtype=None, device_type=None):
        return nullcontext()


def test_clipping_under_a_scaler_unscales_first_bit_for_bit():
    model_a, opt_a, train_a = build(10)
    tm = Session(model_a, opt_a)
    tm.amp = _Fp32WithScaler()
    tm.fit(train_a, epochs=1, accumulate=3, clip=0.5)

    model_b, opt_b, train_b = build(10)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    hand_written(model_b, opt_b, train_b, 1, 3, 0.5, scaler=scaler)

    assert_same(model_a, opt_a, model_b, opt_b)
    assert tm.amp.scaler.get_scale() == scaler.get_scale()


def test_the_clip_bounds_the_true_gradient_norm_under_a_scaler():
    """Clipping before unscaling would bound the scaled norm: the step would be 2**16
    times too small."""
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    x, y = data(16)
    window = Accumulation(1, clip=0.01)
    assert window.add(F.cross_entropy(model(x) * 50, y), opt, scaler)
    moved = torch.cat([(p - b).flatten() for p, b in zip(model.parameters(), before, strict=True)])
    assert moved.norm().item() == pytest.approx(0.01, rel=1e-3)  # lr × the clipped norm


def test_session_step_accumulates_in_the_users_own_loop():
    model_a, opt_a, train_a = build(10)
    tm = Session(model_a, opt_a)
    model_a.train()
    stepped = [
        tm.step(
            F.cross_entropy(model_a(x), y),
            opt_a,
            accumulate=4,
            clip=1.0,
            last=i == len(train_a) - 1,
        )
        for i, (x, y) in enumerate(train_a)
    ]
    assert stepped == [False, False, False, True] * 2 + [False, True]

    model_b, opt_b, train_b = build(10)
    hand_written(model_b, opt_b, train_b, 1, 4, 1.0)
    assert_same(model_a, opt_a, model_b, opt_b)


def test_session_step_refuses_new_settings_while_a_window_is_open():
    model, opt, train = build(4)
    tm = Session(model, opt)
    x, y = next(iter(train))
    assert tm.step(F.cross_entropy(model(x), y), opt, accumulate=2) is False
    grads = [p.grad.clone() for p in model.parameters()]
    with pytest.raises(TorchMagicError, match="1 of 2 batches") as refused:
        tm.step(F.cross_entropy(model(x), y), opt, accumulate=3)
    assert refused.value.param == "accumulate"
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    assert tm.step(F.cross_entropy(model(x), y), opt, accumulate=2) is True
    assert tm.step(F.cross_entropy(model(x), y), opt) is True  # a closed window: new settings


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"accumulate": 0}, "accumulate"),
        ({"accumulate": 1.5}, "accumulate"),
        ({"accumulate": True}, "accumulate"),
        ({"clip": 0.0}, "clip"),
        ({"clip": float("nan")}, "clip"),
        ({"clip": float("inf")}, "clip"),
    ],
)
def test_bad_settings_change_nothing(kwargs, param):
    model, opt, train = build(4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tm = Session(model, opt)
    with pytest.raises(TorchMagicError) as refused:
        tm.fit(train, **kwargs)
    assert refused.value.param == param
    assert not tm.fits and not opt.state
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
x, y = torch.randn(60, 8), torch.randint(0, 3, (60,))
train = DataLoader(TensorDataset(x, y), batch_size=10)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
"""


def test_fit_magic_flags(ip):
    ip.run_cell(SETUP).raise_error()
    with capture_output() as cap:
        history = ip.run_line_magic("fit", "model train --accum 4 --clip 1.5")
    assert (history.accumulate, history.clip, history.steps) == (4, 1.5, 2)
    shown = history._repr_mimebundle_()["text/plain"]  # the cell's result: the run's table
    assert "4 batches per step · clip 1.5" in shown
    assert "4 batches per step" in "".join(o.data["text/plain"] for o in cap.outputs)
    with pytest.raises(UsageError, match="^--accum must be a whole number"):
        ip.run_line_magic("fit", "model train --accum 0")


def test_accumulation_for_an_effective_batch():
    assert accumulation_for(256, 64) == (4, 64)
    assert accumulation_for(256, 100) == (3, 86)  # 258 per step: the smallest reaching 256
    assert accumulation_for(256, 300) == (1, 256)
    assert accumulation_for(7, 1) == (7, 1)


def test_gpumem_batch_says_which_accum_reaches_the_effective_batch(ip):
    ip.run_cell(SETUP).raise_error()
    with capture_output() as cap:
        ip.run_line_magic(
            "gpumem", "batch --input-shape 8 --budget 64MiB --max 48 --effective-batch 100"
        )
    text = cap.outputs[-1].data["text/plain"]
    assert "largest batch on cpu: 48" in text
    assert "effective batch 100: --accum 3 with batches of 34 (102 samples" in text


def test_batch_size_refuses_a_bad_effective_batch():
    model, opt, _ = build(4)
    with pytest.raises(TorchMagicError) as refused:
        Session(model, opt).batch_size((6,), budget=1 << 26, effective_batch=0)
    assert refused.value.param == "effective_batch"


@pytest.mark.slow  # importing Lightning takes 10-30 s here
def test_fit_equals_lightnings_accumulate_grad_batches_bit_for_bit(tmp_path):
    import lightning

    class Module(lightning.LightningModule):
        def __init__(self, model, opt, sched):
            super().__init__()
            self.model, self.opt, self.sched = model, opt, sched

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.model(x), y)

        def configure_optimizers(self):
            return {
                "optimizer": self.opt,
                "lr_scheduler": {"scheduler": self.sched, "interval": "step"},
            }

    def unshuffled():
        """Lightning draws the shuffle of later epochs from the generator in its own way:
        the same batches in the same order each epoch, so only the steps can differ."""
        model, opt, train = build(10)
        return model, opt, DataLoader(train.dataset, batch_size=8)

    model_a, opt_a, train_a = unshuffled()
    sched_a = torch.optim.lr_scheduler.OneCycleLR(opt_a, max_lr=0.2, total_steps=8)
    history = Session(model_a, opt_a, schedulers=[sched_a]).fit(
        train_a, epochs=2, accumulate=3, clip=0.5
    )

    model_b, opt_b, train_b = unshuffled()
    sched_b = torch.optim.lr_scheduler.OneCycleLR(opt_b, max_lr=0.2, total_steps=8)
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        accumulate_grad_batches=3,
        gradient_clip_val=0.5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Module(model_b, opt_b, sched_b), train_dataloaders=train_b)

    assert history.steps == trainer.global_step == 8  # 4 per epoch: 3 + 3 + 3 + 1 batches
    assert sched_a.last_epoch == sched_b.last_epoch
    assert_same(model_a, opt_a, model_b, opt_b)
