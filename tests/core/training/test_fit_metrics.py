"""fit(metric=...): torchmetrics metrics on the validation data after each epoch, equal to
the same torchmetrics computation by hand on the epoch's weights; monitor= naming one for
keep_best and early stop, in its direction; refusals that change nothing; and export=
writing the weights the run kept for inference, checked before any step."""

from __future__ import annotations

import copy
import os
from collections import OrderedDict

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassAUROC,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
)

from builders import blobs
from torchmagic import Session, TorchMagicError
from torchmagic.core.training.fit_events import EpochMetrics
from torchmagic.core.training.progressive import Pacer, Pacing

CLASSES = 6


# a run measuring f1 and keeping the epoch where it is largest
KEEP_BEST_BY_F1: dict = {"metric": "f1", "monitor": "f1", "keep_best": True}


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            body=nn.Linear(8, 32),
            act=nn.ReLU(),
            mid=nn.Linear(32, 32),
            act2=nn.ReLU(),
            fc=nn.Linear(32, CLASSES),
        )
    )


def loaders() -> tuple[DataLoader, DataLoader]:
    x, y = blobs(240, classes=CLASSES)
    xv, yv = blobs(90, classes=CLASSES, seed=1)
    g = torch.Generator().manual_seed(0)
    train = DataLoader(TensorDataset(x, y), batch_size=40, shuffle=True, generator=g)
    return train, DataLoader(TensorDataset(xv, yv), batch_size=25)  # a short last batch


class Weights:
    """An observer keeping a copy of the weights each epoch was validated with."""

    refresh_seconds = float("inf")

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.states: dict[int, dict[str, torch.Tensor]] = {}

    def on_epoch(self, metrics: EpochMetrics) -> None:
        self.states[metrics.epoch] = copy.deepcopy(self.model.state_dict())

    def __getattr__(self, name: str):  # every other event: nothing to keep
        return lambda *args: None


def by_hand(model: nn.Module, state: dict, val: DataLoader) -> dict[str, float]:
    """The metrics as torchmetrics computes them over ``val`` with ``state``'s weights."""
    twin = copy.deepcopy(model)
    twin.load_state_dict(state)
    twin.eval()
    metrics = {
        "accuracy": MulticlassAccuracy(CLASSES, average="micro"),
        "f1": MulticlassF1Score(CLASSES),
        "precision": MulticlassPrecision(CLASSES),
        "recall": MulticlassRecall(CLASSES),
        "top5": MulticlassAccuracy(CLASSES, average="micro", top_k=5),
        "auroc": MulticlassAUROC(CLASSES),
    }
    with torch.no_grad():
        for x, y in val:
            out = twin(x).float()
            for metric in metrics.values():
                metric.update(out, y)
    return {name: float(metric.compute()) for name, metric in metrics.items()}


def test_each_epoch_keeps_the_metrics_torchmetrics_gives_by_hand():
    model, (train, val) = mlp(), loaders()
    tm = Session(model, torch.optim.SGD(model.parameters(), lr=0.05))
    seen = Weights(model)
    names = "accuracy,f1,precision,recall,top5,auroc"
    history = tm.fit(train, val=val, epochs=3, metric=names, observer=seen)
    assert history.metrics == tuple(names.split(","))
    for epoch in history.epochs:
        assert list(epoch.val_metrics) == list(history.metrics)
        assert epoch.val_metrics == by_hand(model, seen.states[epoch.epoch], val)
        # the plain accuracy counts the same hits as torchmetrics' micro accuracy
        assert epoch.val_metrics["accuracy"] == pytest.approx(epoch.val_accuracy, abs=1e-6)
    assert len({e.val_metrics["f1"] for e in history.epochs}) == 3  # the weights moved


def test_monitor_f1_keeps_the_epoch_with_the_largest_f1():
    model, (train, val) = mlp(), loaders()
    tm = Session(model, torch.optim.SGD(model.parameters(), lr=0.2))
    seen = Weights(model)
    history = tm.fit(
        train, val=val, epochs=5, metric="auroc", monitor="f1", keep_best=True, observer=seen
    )
    assert history.metrics == ("auroc", "f1")  # the monitored metric is measured too
    assert history.monitor == "f1"
    f1 = [e.val_metrics["f1"] for e in history.epochs]
    best = f1.index(max(f1)) + 1
    assert history.best_epoch == best
    for key, value in model.state_dict().items():
        assert torch.equal(value, seen.states[best][key])


def test_the_pacer_follows_each_metric_in_its_direction():
    def epoch(n: int, loss: float, f1: float) -> EpochMetrics:
        return EpochMetrics(n, 1.0, loss, None, 1, 1.0, (0.1,), val_metrics={"f1": f1})

    rising = Pacer(Pacing(monitor="f1", higher_is_better=True))
    falling = Pacer(Pacing(monitor="loss"))
    news = []
    for n, (loss, f1) in enumerate([(1.0, 0.5), (0.8, 0.4), (0.9, 0.7)], 1):
        record = epoch(n, loss, f1)
        news.append(
            (rising.observe(n, rising.metric(record)), falling.observe(n, falling.metric(record)))
        )
    assert news == [(True, True), (False, True), (True, False)]
    assert (rising.best_epoch, falling.best_epoch) == (3, 2)


def test_early_stop_on_a_metric_names_it_and_its_best_value():
    model, (train, val) = mlp(), loaders()
    tm = Session(model, torch.optim.SGD(model.parameters(), lr=0.0))  # nothing improves
    history = tm.fit(
        train, val=val, epochs=5, metric="f1", monitor="f1", patience=1, early_stop=True
    )
    assert len(history.epochs) == 2
    first = history.epochs[0].val_metrics["f1"]
    assert history.stopped.startswith("early stop: f1 has not improved for 1 epochs")
    assert f"best {first:.4g} at epoch 1" in history.stopped


def _unchanged(tm: Session, model: nn.Module, before: dict, opt: torch.optim.Optimizer) -> None:
    assert tm.fits == []
    assert not opt.state
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])


@pytest.mark.parametrize(
    "options, param, fragment",
    [
        ({"metric": "f1,bogus"}, "metric", "unknown metric 'bogus'; the metrics are accuracy, f1"),
        ({"metric": ["F1", 3]}, "metric", "unknown metric 3"),
        ({"metric": "f11"}, "metric", "top5, auroc; did you mean f1?"),
        ({"monitor": "bogus"}, "monitor", "monitor must be one of loss, acc, accuracy, f1"),
        ({"metric": "f1", "val": None}, "metric", "metric f1 is measured on the validation data"),
        ({"export": "best.txt"}, "export", "must end in one of .pt2, .safetensors, .onnx"),
        ({"export": "best.py"}, "export", "must end in one of .pt2, .safetensors, .onnx"),
        ({"export": "no/such/folder/best.pt2"}, "export", "no folder"),
    ],
)
def test_refused_before_any_step(tmp_path, monkeypatch, options, param, fragment):
    monkeypatch.chdir(tmp_path)
    model, (train, val) = mlp(), loaders()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    tm = Session(model, opt)
    before = copy.deepcopy(model.state_dict())
    given = {"val": val, **options}
    with pytest.raises(TorchMagicError) as refused:
        tm.fit(train, epochs=2, **given)
    assert fragment in str(refused.value) and len(str(refused.value).splitlines()) == 1
    assert refused.value.param == param
    _unchanged(tm, model, before, opt)
    assert os.listdir(tmp_path) == []


def test_top5_over_fewer_classes_is_refused_before_any_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = blobs(40, classes=3)
    data = DataLoader(TensorDataset(x, y), batch_size=10)
    tm = Session(model, opt)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(TorchMagicError, match="top5 needs at least 5 classes; the head of"):
        tm.fit(data, val=data, metric="f1,top5")
    _unchanged(tm, model, before, opt)


def test_export_writes_the_best_epochs_weights(tmp_path):
    model, (train, val) = mlp(), loaders()
    tm = Session(model, torch.optim.SGD(model.parameters(), lr=0.2))
    seen = Weights(model)
    path = tmp_path / "best.safetensors"
    path.write_bytes(b"an older export")  # replaced
    history = tm.fit(
        train,
        val=val,
        epochs=4,
        export=str(path),
        observer=seen,
        **KEEP_BEST_BY_F1,
    )
    assert history.exported is not None and history.not_exported is None
    assert history.exported.path == str(path) and history.exported.max_difference == 0.0
    written = load_file(path)
    best = seen.states[history.best_epoch]
    assert written.keys() == best.keys()
    for key, value in written.items():
        assert torch.equal(value, best[key])
    fresh = mlp()
    fresh.load_state_dict(written, strict=True)
    x = next(iter(val))[0]
    model.eval()
    with torch.no_grad():
        assert torch.equal(fresh.eval()(x), model(x))


def test_export_without_keep_best_writes_the_last_weights(tmp_path):
    model, (train, val) = mlp(), loaders()
    tm = Session(model, torch.optim.SGD(model.parameters(), lr=0.05))
    path = tmp_path / "last.safetensors"
    history = tm.fit(train, val=val, epochs=2, export=str(path))
    assert history.best_epoch is None and history.exported is not None
    for key, value in load_file(path).items():
        assert torch.equal(value, model.state_dict()[key])


class CtrlCInSecondEpoch:
    """A loader whose second pass is interrupted at its third batch."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader, self.passes = loader, 0

    def __iter__(self):
        self.passes += 1
        for i, batch in enumerate(self.loader):
            if self.passes == 2 and i == 2:
                raise KeyboardInterrupt
            yield batch


def test_an_interrupted_run_exports_nothing(tmp_path):
    model, (train, val) = mlp(), loaders()
    tm = Session(model, torch.optim.SGD(model.parameters(), lr=0.05))
    path = tmp_path / "best.safetensors"
    history = tm.fit(CtrlCInSecondEpoch(train), val=val, epochs=3, keep_best=True, export=str(path))
    assert history.best_epoch == 1 and history.exported is None and not path.exists()
    assert history.not_exported == f"nothing exported to {path}: the run was interrupted"


def test_fine_tune_exports_its_second_runs_best_epoch(tmp_path):
    model, (train, val) = mlp(), loaders()
    tm = Session(model, torch.optim.SGD(model.parameters(), lr=0.1))
    seen = Weights(model)
    path = tmp_path / "tuned.safetensors"
    result = tm.fine_tune(
        train,
        val=val,
        epochs=3,
        export=str(path),
        observer=seen,
        **KEEP_BEST_BY_F1,
    )
    head, full = result.head_fit, result.full_fit
    assert head.metrics == full.metrics == ("f1",) and head.exported is None
    assert full.exported is not None and full.best_epoch is not None
    f1 = [e.val_metrics["f1"] for e in full.epochs]
    assert full.best_epoch == f1.index(max(f1)) + 1
    # the observer's last copy of each epoch number is the second run's
    for key, value in load_file(path).items():
        assert torch.equal(value, seen.states[full.best_epoch][key])


def test_fine_tune_refuses_a_bad_export_before_freezing(tmp_path):
    model, (train, val) = mlp(), loaders()
    tm = Session(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TorchMagicError, match="must end in one of"):
        tm.fine_tune(train, val=val, epochs=1, export=str(tmp_path / "tuned.pkl"))
    assert all(p.requires_grad for p in model.parameters())
    assert tm.history() == () and tm.fits == []


def test_pt2_export_runs_the_best_epochs_weights(tmp_path):
    model, (train, val) = mlp(), loaders()
    tm = Session(model, torch.optim.SGD(model.parameters(), lr=0.2))
    seen = Weights(model)
    path = tmp_path / "best.pt2"
    history = tm.fit(
        train,
        val=val,
        epochs=3,
        export=str(path),
        observer=seen,
        **KEEP_BEST_BY_F1,
    )
    assert history.exported is not None and history.exported.format == "pt2"
    program = torch.export.load(str(path)).module()
    best = mlp()
    best.load_state_dict(seen.states[history.best_epoch])
    x = torch.cat([b[0] for b in val])[:7]  # another batch size than the traced one
    with torch.no_grad():
        assert torch.allclose(program(x), best.eval()(x), rtol=0, atol=1e-5)


HOST_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


def test_metrics_read_no_value_per_validation_batch(monkeypatch):
    """Updated on the device, read once at the epoch's end: the host reads of a run do not
    grow with its validation batches (auroc is left out: torchmetrics checks whether its
    scores are probabilities with one read per batch)."""
    counts = {"reads": 0}
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            counts["reads"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    x, y = blobs(40, classes=CLASSES)
    reads = []
    for batch_size in (20, 2):  # 2 validation batches, then 20
        model = mlp()
        tm = Session(model, torch.optim.SGD(model.parameters(), lr=0.05))
        val = DataLoader(TensorDataset(x, y), batch_size=batch_size)
        counts["reads"] = 0
        tm.fit([(x, y)], val=val, metric="accuracy,f1,precision,recall,top5")
        reads.append(counts["reads"])
    assert reads[0] == reads[1]


def test_cached_features_measure_the_same_metrics():
    """Linear probing on cached features validates the head on the stored features: the
    metrics are those of the uncached run."""
    runs = []
    for cached in (False, True):
        model, (train, val) = mlp(), loaders()
        for p in [*model.body.parameters(), *model.mid.parameters()]:
            p.requires_grad_(False)
        opt = torch.optim.SGD(model.fc.parameters(), lr=0.1)
        history = Session(model, opt).fit(
            train, val=val, epochs=2, metric="f1,auroc", cache_features=cached
        )
        runs.append([e.val_metrics for e in history.epochs])
    for plain, cached in zip(*runs, strict=True):
        assert plain.keys() == cached.keys() == {"f1", "auroc"}
        for name in plain:
            assert cached[name] == pytest.approx(plain[name], abs=1e-6)
