"""Golden-file tests: every renderer, on a fixed result, at width 100, as ``text/plain``.

Each case builds a deterministic result (by hand, or from a tiny model where the engine's
own numbers are the point), renders it with ``render.render(result, width=100)`` and
compares the text with ``tests/golden/<case>.txt``. After an intended change of the
output, regenerate the files and review their diff::

    TORCHMAGIC_UPDATE_GOLDEN=1 pytest tests/test_golden.py

A missing golden file is written on first run and the test fails, so it is never
silently accepted.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from rich.table import Table
from torch import nn

from torchmagic import Session, render
from torchmagic.core.checkpoint import ResumeReport, SaveReport
from torchmagic.core.devices.batch_size import BatchPoint, BatchSizeReport
from torchmagic.core.devices.compare import CompareReport, DeviceTiming
from torchmagic.core.devices.device import DeviceInfo, DeviceReport, MoveReport
from torchmagic.core.devices.estimate import Estimate, StepPeak
from torchmagic.core.devices.memory import CellMemory, MemoryReport, ResetReport
from torchmagic.core.devices.pinbench import PinReport
from torchmagic.core.devices.placement import CheckReport, Misplaced
from torchmagic.core.diagnostics.doctor import DoctorReport
from torchmagic.core.diagnostics.findings import Finding
from torchmagic.core.evaluation import (
    ClassRow,
    Comparison,
    Evaluation,
    Prediction,
    Predictions,
    WorstSample,
)
from torchmagic.core.export import ExportReport, InferenceReport
from torchmagic.core.export.metadata import Preprocessing
from torchmagic.core.surgery.results import (
    Change,
    CommandHistory,
    Counts,
    Effect,
    GroupInfo,
    HistoryEntry,
)
from torchmagic.core.training.amp import KEPT_FP32, KEPT_FP32_REASON, AmpStatus
from torchmagic.core.training.fit_events import EpochMetrics, FitHistory, StepInfo
from torchmagic.core.training.lr_find import STEEPEST, LrFindResult
from torchmagic.core.training.progressive import Unfrozen
from torchmagic.core.training.recipe import FineTuneResult
from torchmagic.core.zoo import LoadedModel, WeightsInfo
from torchmagic.render import FitRuns, MagicHelp, ManifestHelp, NotebookProgress
from torchmagic.render.base import _parts

GOLDEN = Path(__file__).parent / "golden"
WIDTH = 100
UPDATE = os.environ.get("TORCHMAGIC_UPDATE_GOLDEN") == "1"


# -- tiny live model -----------------------------------------------------------------


def _block(channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(channels, channels, 3, bias=False), nn.BatchNorm2d(channels))


def _tiny() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(
        OrderedDict(
            stem=nn.Conv2d(3, 8, 3),
            layer1=_block(8),
            layer2=_block(8),
            pool=nn.AdaptiveAvgPool2d(1),
            flat=nn.Flatten(),
            fc=nn.Linear(8, 4),
        )
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)


def _freeze_live() -> Change:
    model, opt = _tiny()
    return Session(model, opt).freeze("layer1-2", command="%freeze layer1-2")


def _summary_live():
    model, opt = _tiny()
    tm = Session(model, opt)
    tm.freeze("layer1-2")
    tm.unfreeze("layer2", lr=1e-4)
    return tm.summary(depth=2)


def _summary_shapes_live():
    model, _ = _tiny()
    return Session(model).summary(depth=1, input_shape=(2, 3, 16, 16))


def _magic_help() -> MagicHelp:
    entry = {
        "name": "freeze",
        "kind": "line",
        "usage": "%freeze TARGETS [--dry-run]",
        "summary": "Stop training the named blocks; `requires_grad` off.",
        "arguments": [
            {"name": "targets", "kind": "positional", "help": "modules", "default": None},
            {
                "name": "--dry-run",
                "dest": "dry_run",
                "kind": "flag",
                "help": "change nothing",
                "default": False,
            },
        ],
        "key_values": [],
        "example": "%freeze layer1-3",
        "docs": "https://example.org/docs/magics.md#freeze",
    }
    return MagicHelp(entry)


def _dry_run_live() -> Change:
    model, opt = _tiny()
    return Session(model, opt).freeze("layer1", dry_run=True, command="%freeze layer1 --dry-run")


def _undo_live() -> Change:
    model, opt = _tiny()
    tm = Session(model, opt)
    tm.freeze("layer1", command="%freeze layer1")
    return tm.undo()


def _unchanged_live() -> Change:
    model, opt = _tiny()
    tm = Session(model, opt)
    tm.freeze("layer1-2", command="%freeze layer1-2")
    return tm.freeze("layer1-2", command="%freeze layer1-2")


def _except_live() -> Change:
    """The title names what was kept out; pool and flat (no parameters) are not listed."""
    model, opt = _tiny()
    return Session(model, opt).freeze(exclude=["fc"], command="%freeze model --except fc")


def _partly_already_live() -> Change:
    model, opt = _tiny()
    tm = Session(model, opt)
    tm.freeze("layer1-2")
    tm.unfreeze("layer2")
    return tm.unfreeze("layer1-2", command="%unfreeze layer1-2")


# -- hand-built results ----------------------------------------------------------------

_COUNTS_BEFORE = Counts(
    total=11_689_512, trainable=2_775_040, tensors=62, param_bytes=0, buffer_bytes=0
)
_COUNTS_AFTER = Counts(
    total=11_689_512, trainable=11_166_912, tensors=62, param_bytes=0, buffer_bytes=0
)


def _unfreeze_scheduled() -> Change:
    """lr=1e-4 under a warm-restart cosine nine steps in: base and now differ."""
    groups = (
        GroupInfo(0, "head", 2.45e-5, 0.0, 2, 513_000, "", 1e-3, ("CosineAnnealingWarmRestarts",)),
        GroupInfo(
            1, "layer4", 2.45e-6, 0.05, 12, 8_393_728, "new", 1e-4, ("CosineAnnealingWarmRestarts",)
        ),
        GroupInfo(
            2,
            "layer4 · no_decay",
            2.45e-6,
            0.0,
            6,
            5_120,
            "new",
            1e-4,
            ("CosineAnnealingWarmRestarts",),
        ),
    )
    return Change(
        action="unfreeze",
        command="%unfreeze layer4 lr=1e-4",
        model_name="model",
        effect=Effect(("layer4",), 8_398_848, 0, {"train": 5}),
        before=_COUNTS_BEFORE,
        after=_COUNTS_AFTER,
        optimizer_name="optimizer",
        groups=groups,
    )


def _mixed_schedules() -> Change:
    """Groups stepped by different schedulers show them beside each lr."""
    groups = (
        GroupInfo(0, "0", 0.01, None, 2, 100, "", 0.1, ("OneCycleLR",)),
        GroupInfo(1, "1", 0.001, None, 2, 100, "changed", None, ("ReduceLROnPlateau",)),
        GroupInfo(2, "2", 0.0, None, 0, 0, "", None, ()),
    )
    return Change(
        action="replace_head",
        command="%replace_head fc 10",
        model_name="net",
        effect=Effect(("fc",), 5_130, 0, {}, ("new head: Linear(512, 10) on cpu float32",)),
        before=_COUNTS_BEFORE,
        after=_COUNTS_AFTER,
        optimizer_name="opt",
        groups=groups,
    )


def _no_optimizer() -> Change:
    return Change(
        action="freeze",
        command="%freeze features.0-6",
        model_name="net",
        effect=Effect(
            tuple(f"features.{i}" for i in range(9)),
            1_234_567,
            2_097_152,
            {"held": 3, "frozen": 1},
        ),
        before=_COUNTS_AFTER,
        after=_COUNTS_BEFORE,
        optimizer_name=None,
        groups=(),
    )


def _history() -> CommandHistory:
    return CommandHistory(
        (
            HistoryEntry(
                1,
                "%freeze [weird] layer1-3",
                "freeze",
                "model",
                ("layer1", "layer2", "layer3"),
                True,
            ),
            HistoryEntry(2, "%replace_head auto 10", "replace_head", "old", ("fc",), False),
        )
    )


def _manifest() -> ManifestHelp:
    return ManifestHelp(
        {
            "name": "torchmagic",
            "version": "0.0.0",
            "load": "%load_ext torchmagic",
            "documentation": "https://example.org/docs/magics.md",
            "magics": [
                {
                    "name": "freeze",
                    "kind": "line",
                    "usage": "%freeze TARGET... [--dry-run]",
                    "summary": "Stop training the named blocks.",
                    "example": "%freeze layer1-3",
                    "purpose": "stop training the named blocks",
                    "docs": "https://example.org/docs/magics.md#freeze",
                },
                {
                    "name": "amp",
                    "kind": "cell",
                    "usage": "%%amp [MODE]",
                    "summary": "Run one cell under autocast.",
                    "example": "%%amp bf16",
                    "purpose": "one cell under `autocast`",
                    "docs": "https://example.org/docs/magics.md#amp",
                },
            ],
        }
    )


def _epochs() -> tuple[EpochMetrics, ...]:
    return (
        EpochMetrics(1, 1.2345678, 1.1, 0.5, 512, 2.0, (1e-3, 1e-4)),
        EpochMetrics(2, 0.87654, None, None, 512, 1.6, (5e-4, 5e-5)),
    )


def _fit(label: str = "fit 1", stopped: str | None = None, cached: bool = False) -> FitHistory:
    return FitHistory(
        label,
        "model",
        _epochs(),
        steps=16,
        samples=1024,
        seconds=3.6,
        stopped=stopped,
        cached_features=cached,
        precision="bf16",
    )


def _metric_epochs(f1: tuple[float, float, float]) -> tuple[EpochMetrics, ...]:
    lrs = (1e-3,)
    return tuple(
        EpochMetrics(
            i + 1,
            1.0 - 0.25 * i,
            0.9 - 0.125 * i,
            0.5 + 0.125 * i,
            512,
            2.0,
            lrs,
            val_metrics={"f1": value, "auroc": 0.75 + 0.0625 * i},
        )
        for i, value in enumerate(f1)
    )


def _fit_metrics() -> FitHistory:
    """keep_best by f1 with the weights exported for inference."""
    exported = InferenceReport(
        "model", "pt2", "best.pt2", 46_399_488, 3.1e-7, 1e-4, (3, 3, 224, 224), None, None, 0
    )
    return FitHistory(
        "fit 1",
        "model",
        _metric_epochs((0.5, 0.8125, 0.75)),
        steps=24,
        samples=1536,
        seconds=6.0,
        best_epoch=2,
        metrics=("f1", "auroc"),
        monitor="f1",
        exported=exported,
    )


def _devices() -> DeviceReport:
    return DeviceReport(
        devices=(
            DeviceInfo("cpu", "AMD EPYC", "", None, 68_719_476_736, False, "16 threads", False),
            DeviceInfo(
                "cuda:0",
                "NVIDIA H200",
                "9.0",
                140 * 2**30,
                141 * 2**30,
                True,
                "132 multiprocessors",
                True,
            ),
        ),
        current="cuda:0",
        notes=("CUDA initialised by this command",),
    )


_STRAY = (
    Misplaced("anchors", "attribute", "cpu", (4, 2), 32, "register it as a buffer"),
    Misplaced(
        "optimizer.state[fc.weight].exp_avg",
        "optimizer state",
        "cuda:0",
        (),
        4,
        "move the optimizer state",
    ),
)


def _moved() -> MoveReport:
    return MoveReport("model", "cuda:0", 46_800_000, 0, 93_600_000, 4, 124, _STRAY[:1])


def _pin() -> PinReport:
    return PinReport(
        True,
        "",
        "cuda:0",
        25_165_824,
        2,
        4.0,
        3.9,
        1.2,
        0.6,
        2.5,
        20,
        False,
        6.7,
        True,
        "use pin_memory=True and non_blocking=True: 6.7x faster copies",
    )


def _memory_cuda() -> MemoryReport:
    return MemoryReport(
        "model",
        "cuda:0",
        "cuda allocator",
        44_000_000,
        2_000_000,
        38_000,
        44_000_000,
        88_000_000,
        1_024,
        300_000_000,
        400_000_000,
        350_000_000,
        100 * 2**30,
        141 * 2**30,
        3,
        12_000_000,
    )


def _memory_meta() -> MemoryReport:
    return MemoryReport(None, "meta", "", 100, 0, 0, 0, 0, 0, None, None, None, None, None, 0, 0)


def _estimate() -> Estimate:
    return Estimate(
        "model",
        "AdamW",
        46_800_000,
        38_000,
        34_000_000,
        68_000_000,
        "2 tensors per parameter (exp_avg, exp_avg_sq) + step",
        1_000_000,
        120_000_000,
        (32, 3, 224, 224),
        StepPeak(
            persistent=114_838_000,
            grads=34_000_000,
            input=19_267_584,
            saved_activations=120_000_000,
            forward_live=150_000_000,
            backward_saved=90_000_000,
            backward_grads=34_000_000,
            activation_grads=60_000_000,
            optimizer_temporaries=68_000_000,
            optimizer_impl="foreach",
            autocast_copies=0,
            workspace=0,
        ),
        8_500_000,
        3_189_000,
        38_000_000,
    )


def _estimate_unknown() -> Estimate:
    return Estimate(
        "net", "", 400, 0, 400, None, "unknown optimizer", 0, None, None, None, 100, 0, None
    )


def _doctor() -> DoctorReport:
    return DoctorReport(
        findings=(
            Finding(
                "stale-optimizer",
                "error",
                "optimizer",
                "holds none of model's parameters",
                "re-create the optimizer",
            ),
            Finding(
                "idle-state",
                "warning",
                "optimizer",
                "frozen parameters keep state",
                "free it",
                4_194_304,
            ),
            Finding("amp", "info", "session", "bf16 available", "turn AMP on"),
        ),
        scanned=("model", "optimizer"),
    )


class _Handle:
    """A display handle: remembers what was shown last."""

    def __init__(self) -> None:
        self.shown: list[render.Rendered] = []

    def show(self, rendered: render.Rendered) -> _Handle:
        self.shown.append(rendered)
        return self

    def update(self, rendered: render.Rendered) -> None:
        self.shown.append(rendered)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _progress(stage: str) -> render.Rendered:
    """A notebook progress at one stage of a 2-epoch run, on a fake clock."""
    handle, clock = _Handle(), FakeClock()
    progress = NotebookProgress(handle.show, WIDTH, clock=clock)
    clock.now += 6.0
    progress.on_step(StepInfo(1, 2, 5, 5, 8, 0.42, 0.98765, (1e-3, 1e-4)))
    if stage in ("validating", "epoch", "closed"):
        clock.now += 3.0
        progress.on_validation_start(1, 4)
    if stage in ("epoch", "closed"):
        clock.now += 1.0
        progress.on_epoch(_epochs()[0])
    if stage == "closed":
        clock.now += 62.0
        progress.close()
    return handle.shown[-1]


PROGRESS = {
    "notebook_progress": "step",
    "notebook_progress_validating": "validating",
    "notebook_progress_epoch_end": "epoch",
    "notebook_progress_closed": "closed",
}


def _lr_find(suggestion: float | None = 3e-3) -> LrFindResult:
    lrs = tuple(1e-5 * 10 ** (i / 4) for i in range(17))
    losses = tuple(1.6 - 0.1 * min(i, 12) + (0.5 if i > 14 else 0.0) for i in range(17))
    return LrFindResult(
        "model",
        lrs,
        losses,
        losses,
        suggestion,
        STEEPEST,
        None if suggestion is None else (1e-4, 1e-2),
        1,
        "fc",
        (0.1, 1.0),
        1e-5,
        10.0,
        100,
        stopped="the smoothed loss passed 4× its minimum at lr 0.1",
    )


def _progressive() -> FitHistory:
    history = _fit()
    return FitHistory(
        history.label,
        history.model_name,
        history.epochs,
        history.steps,
        history.samples,
        history.seconds,
        precision="bf16",
        unfreezes=(Unfrozen(1, "layer4", 3e-4),),
        best_epoch=2,
        data_wait_s=2.2,
        wall_s=3.6,
    )


def _fine_tune() -> FineTuneResult:
    return FineTuneResult(
        "model", 1e-3, ("conv1", "layer1", "fc"), _freeze_live(), _fit(), None, None
    )


def _image_folders() -> object:
    """%load_data's report: a split folder with an imbalance and two leaked files."""
    from pathlib import Path

    from torch.utils.data import DataLoader

    from torchmagic.core.data.loaders import ClassCount, ImageFolders
    from torchmagic.core.data.transforms import Pipelines

    counts = (ClassCount("ants", 120, 30), ClassCount("bees", 36, 9))
    return ImageFolders(
        root=Path("images"),
        presplit=False,
        valid=0.2,
        classes=("ants", "bees"),
        counts=counts,
        train_loader=DataLoader([0], batch_size=32),
        val_loader=DataLoader([0], batch_size=32),
        pipelines=Pipelines(
            eval=str,
            train=str,
            size=224,
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
            source="ResNet18_Weights.IMAGENET1K_V1",
        ),
        workers=2,
        pin_memory=False,
        leaks=(("ants/a1.jpg", "ants/copy of a1.jpg"), ("bees/b7.png", "bees/b7 (1).png")),
        imbalance=counts,
        model="model",
    )


def _evaluation() -> Evaluation:
    return Evaluation(
        model_name="model",
        data_name="val_loader",
        samples=16,
        accuracy=0.75,
        loss=0.6931,
        confusion=torch.tensor([[5, 1, 0], [2, 3, 1], [0, 0, 4]]),
        per_class=(
            ClassRow("cat", 0.714, 0.833, 0.769, 6),
            ClassRow("dog", 0.75, 0.5, 0.6, 6),
            ClassRow("owl", 0.8, 1.0, 0.889, 4),
        ),
        labels=("cat", "dog", "owl"),
        most_confused=(("dog", "cat", 2), ("cat", "dog", 1), ("dog", "owl", 1)),
        worst=(
            WorstSample(7, 2.5, 1, 0, "val/dog/7.jpg"),
            WorstSample(3, 1.25, 0, 1, "val/cat/3.jpg"),
        ),
        top_k=2,
        top_k_accuracy=0.9375,
        correct=torch.ones(16, dtype=torch.bool),
        targets_fingerprint="0" * 16,
        comparison=Comparison(0.125, 3, 1, 0.625),
    )


_CAT = Prediction("photos/cat.jpg", ("cat", "owl", "dog"), (0.8125, 0.125, 0.0625))


CASES: dict[str, Callable[[], object]] = {
    "image_folders": _image_folders,
    "change_freeze": _freeze_live,
    "evaluation": _evaluation,
    "prediction": lambda: _CAT,
    "predictions": lambda: Predictions(
        "model", (_CAT, Prediction("photos/dog.jpg", ("dog", "cat", "owl"), (0.5, 0.25, 0.25)))
    ),
    "change_dry_run": _dry_run_live,
    "change_undo": _undo_live,
    "change_unfreeze_scheduled": _unfreeze_scheduled,
    "change_mixed_schedules": _mixed_schedules,
    "change_no_optimizer": _no_optimizer,
    "change_unchanged": _unchanged_live,
    "change_except": _except_live,
    "change_partly_already": _partly_already_live,
    "summary": _summary_live,
    "summary_shapes": _summary_shapes_live,
    "magic_help": _magic_help,
    "history": _history,
    "history_empty": lambda: CommandHistory(()),
    "history_all_undone": lambda: CommandHistory((), ("%unfreeze layer4", "%freeze layer1-3")),
    "manifest_help": _manifest,
    "message": lambda: "current model: model",
    "fit_history": _fit,
    "fit_history_stopped": lambda: _fit(stopped="reached max_steps=16", cached=True),
    "fit_history_no_validation": lambda: FitHistory(
        "fit 3",
        "model",
        (
            EpochMetrics(1, 2.5, None, None, 3, 7.1, (0.1, 0.1)),
            EpochMetrics(2, 1.5, None, None, 3, 7.0, (0.1, 0.1)),
        ),
        steps=2,
        samples=6,
        seconds=14.1,
    ),
    "fits": lambda: FitRuns((_fit(), _fit("fit 2", stopped="interrupted"))),
    "fit_history_metrics": _fit_metrics,
    "fit_history_not_exported": lambda: FitHistory(
        "fit 2",
        "model",
        _metric_epochs((0.5, 0.25, 0.125))[:2],
        steps=16,
        samples=1024,
        seconds=4.0,
        stopped="interrupted; the last completed step is 16",
        metrics=("f1", "auroc"),
        not_exported="nothing exported to best.safetensors: the run was interrupted",
    ),
    "fits_metrics": lambda: FitRuns(
        (
            _fit_metrics(),
            FitHistory(
                "fit 2",
                "model",
                _metric_epochs((0.625, 0.5, 0.5625)),
                steps=24,
                samples=1536,
                seconds=6.0,
                metrics=("f1", "auroc"),
            ),
        )
    ),
    "fits_empty": lambda: FitRuns(()),
    "amp_off": lambda: AmpStatus(False, None, "cpu", False, None),
    "amp_fp16": lambda: AmpStatus(True, "float16", "cuda", True, 65536.0, "GradScaler created"),
    "amp_bf16": lambda: AmpStatus(True, "bfloat16", "cuda", False, None),
    "amp_kept_fp32": lambda: AmpStatus(
        False, None, "cpu", False, None, KEPT_FP32, KEPT_FP32_REASON
    ),
    "devices": _devices,
    "moved": _moved,
    "moved_nothing": lambda: MoveReport("model", "cpu", 0, 0, 0, 0, 0, ()),
    "moved_nothing_left_behind": lambda: MoveReport("model", "cpu", 0, 0, 0, 0, 0, _STRAY[:1]),
    "misplaced": lambda: CheckReport("model", "cuda:0", 130, _STRAY),
    "misplaced_none": lambda: CheckReport("model", "cuda:0", 130, ()),
    "misplaced_no_tensors": lambda: CheckReport("model", None, 0, ()),
    "pinbench": _pin,
    "pinbench_not_ran": lambda: PinReport(False, "no CUDA device: pinned memory cannot help"),
    "memory": _memory_cuda,
    "memory_meta": _memory_meta,
    "memory_reset": lambda: ResetReport(("cuda:0",), 3, 12_000_000),
    "memory_reset_none": lambda: ResetReport((), 0, 0),
    "memory_cell": lambda: CellMemory("cuda:0", 1_000_000, 3_000_000, 5_000_000),
    "estimate": _estimate,
    "estimate_unknown": _estimate_unknown,
    "doctor": _doctor,
    "doctor_clean": lambda: DoctorReport((), ()),
    "batch_size": lambda: BatchSizeReport(
        "cuda:0",
        184,
        60_000_000_000,
        1_200_000_000,
        310_000_000,
        "backward",
        (
            BatchPoint(2, 1_820_000_000, (900_000_000, 1_820_000_000, 1_500_000_000)),
            BatchPoint(4, 2_440_000_000, (1_500_000_000, 2_440_000_000, 1_500_000_000)),
            BatchPoint(8, 3_680_000_000, (2_700_000_000, 3_680_000_000, 1_500_000_000)),
        ),
        58_400_000_000,
        1,
        False,
        3.2,
    ),
    "batch_size_none": lambda: BatchSizeReport(
        "cpu",
        0,
        1_000_000,
        900_000,
        500_000,
        "backward",
        (
            BatchPoint(2, 1_900_000, (700_000, 1_900_000, 1_200_000)),
            BatchPoint(4, 2_900_000, (1_100_000, 2_900_000, 1_200_000)),
        ),
        None,
        0,
        False,
        0.4,
    ),
    "batch_size_flat": lambda: BatchSizeReport(
        "cpu",
        0,
        1_000_000,
        600_000,
        0,
        "",
        (
            BatchPoint(2, 600_000, (100_000, 200_000, 600_000)),
            BatchPoint(4, 600_000, (100_000, 200_000, 600_000)),
        ),
        None,
        0,
        False,
        0.4,
    ),
    "compare": lambda: CompareReport(
        "model",
        64,
        38_535_168,
        5,
        2,
        "AdamW",
        (
            DeviceTiming("cpu", 412.5, 0.0, 155.2),
            DeviceTiming("cuda:0", 21.4, 6.1, 2990.7),
            DeviceTiming("cuda:1", skipped="not enough free memory for a copy"),
        ),
        ("cuda:0", "cuda:1"),
        "",
    ),
    "compare_cpu_only": lambda: CompareReport(
        "model",
        32,
        393_216,
        5,
        2,
        "SGD",
        (DeviceTiming("cpu", 12.0, 0.0, 2666.7),),
        (),
        "no CUDA or MPS device: torch.cuda.is_available() is False",
    ),
    "loaded_model": lambda: LoadedModel(
        torch.nn.Linear(4, 2),
        "resnet18",
        "torchvision",
        "ResNet18_Weights.IMAGENET1K_V1",
        None,
        ("tench", "goldfish"),
        WeightsInfo(
            "ResNet18_Weights.IMAGENET1K_V1",
            "torchvision",
            11_689_512,
            (("ImageNet-1K", "acc@1", 69.758), ("ImageNet-1K", "acc@5", 89.078)),
            224,
            256,
            (0.485, 0.456, 0.406),
            (0.229, 0.224, 0.225),
            1000,
            44.7,
        ),
    ),
    "loaded_model_random": lambda: LoadedModel(
        torch.nn.Linear(4, 2), "resnet18", "torchvision", None, None, None, None
    ),
    "lr_find": _lr_find,
    "lr_find_no_suggestion": lambda: _lr_find(None),
    "fit_history_progressive": _progressive,
    "fine_tune": _fine_tune,
    "saved": lambda: SaveReport(
        "run.pt",
        134_217_728,
        "model",
        "ResNet",
        "optimizer",
        ("%freeze model.layer1-3", "%replace_head fc 5", "%unfreeze layer3 lr=1e-4"),
        2,
        ("CosineAnnealingLR",),
        None,
    ),
    "resumed": lambda: ResumeReport(
        "run.pt",
        "model",
        "ResNet",
        "optimizer",
        ("%freeze model.layer1-3", "%replace_head fc 5"),
        1,
        (),
        "bf16",
        "0.1.0",
    ),
    "exported": lambda: ExportReport(
        "run.py", (("model", "ResNet"), ("optimizer", "AdamW"), ("train_loader", "batches")), 4
    ),
    "exported_for_inference": lambda: InferenceReport(
        "model",
        "pt2",
        "model.pt2",
        46_300_000,
        3.1e-7,
        1e-4,
        (3, 3, 224, 224),
        ("cat", "dog", "fox", "owl", "hen", "elk"),
        Preprocessing(256, 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        2,
    ),
    "exported_for_inference_unchecked": lambda: InferenceReport(
        "net", "onnx", "net.onnx", 9_000, None, 1e-4, (3, 16), None, None, 0
    ),
}


def _rendered(case: str) -> render.Rendered:
    if case in PROGRESS:
        return _progress(PROGRESS[case])
    return render.render(CASES[case](), width=WIDTH)


ALL_CASES = [*CASES, *PROGRESS]


@pytest.mark.parametrize("case", ALL_CASES)
def test_golden(case: str) -> None:
    bundle = _rendered(case)._repr_mimebundle_()
    text = bundle["text/plain"]
    html = bundle["text/html"]
    tables = sum(isinstance(part, Table) for part in _parts(_rendered(case).renderable))
    assert html.count("<table") == tables and ("<pre" in html or tables)
    assert all(line == line.rstrip() for line in text.splitlines()), "trailing spaces"
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    golden = GOLDEN / f"{case}.txt"
    if UPDATE or not golden.exists():
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(text + "\n", encoding="utf-8")
        if not UPDATE:
            pytest.fail(f"wrote missing golden file {golden.name}: review it and rerun")
    assert text + "\n" == golden.read_text(encoding="utf-8")


def test_every_registered_type_has_a_case() -> None:
    registered = set(render.render.registry) - {object}
    covered = {type(factory()) for factory in CASES.values()}
    assert registered <= covered, registered - covered


def test_unregistered_type_is_refused() -> None:
    with pytest.raises(TypeError, match="nothing renders a dict"):
        render.render({"not": "a result"})
