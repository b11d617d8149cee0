"""``%fit``, ``%amp`` and ``%%amp``: training and mixed precision."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING

from IPython.core.magic import line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, real_name
from IPython.display import display

from ..core import FitOptions, LrFindOptions, TorchMagicError
from ..core.choices import MODES, POLICIES, SCHEDULES
from .base import OPT, TopicMagics, parse, render
from .shown import ShownResult, echoed_in_a_terminal
from .usage import CellUsage, MagicFunction, Subcommand, subcommands, usage

if TYPE_CHECKING:
    Progress = render.TerminalProgress | render.NotebookProgress

_MODE_WORDS = f"[{'|'.join(MODES)}]"


# Arguments every training magic takes (one decorator object serves each of them).
MODEL_AND_TRAIN = argument(
    "names",
    nargs="+",
    metavar="[MODEL] TRAIN_LOADER",
    help="the model variable (default: the current model) and the training loader",
)
ACCUM = argument(
    "--accum",
    dest="accumulate",  # the Python parameter: refusals name the flag
    type=int,
    default=1,
    metavar="N",
    help="gradient accumulation: one optimizer step per N batches, each loss divided by N",
)
CLIP = argument(
    "--clip",
    type=float,
    default=None,
    metavar="NORM",
    help="clip the total gradient norm to NORM before each step (after unscaling under fp16)",
)
LOSS = argument(
    "--loss",
    default="cross_entropy",
    metavar="NAME",
    help="cross_entropy, nll, bce, mse, l1, smooth_l1, huber, or a callable variable",
)
METRIC = argument(
    "--metric",
    default=None,
    metavar="NAME[,NAME]",
    help="torchmetrics on the validation data after each epoch: accuracy, f1, precision, "
    "recall, top5, auroc",
)
MONITOR = argument(
    "--monitor",
    default="loss",
    metavar="NAME",
    help="what --keep-best, --patience and --early-stop follow: loss, acc or a --metric name",
)
KEEP_BEST = argument(
    "--keep-best",
    action="store_true",
    help="load the best epoch's weights back at the end (one host copy of the weights)",
)
EXPORT = argument(
    "--export",
    default=None,
    metavar="PATH",
    help="after the run, export the weights the model holds (the best epoch's with "
    "--keep-best) for inference: .pt2, .safetensors or .onnx",
)


@magics_class
class TrainingMagics(TopicMagics):
    """Train with the model's own optimizer and schedulers; mixed precision for the
    session or for one cell."""

    # -- subcommands: one Session call each, rendered (the table below lists them) ----

    def _amp_status(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.amp_status(), self.width)

    def _amp_on(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.amp_on(*words), self.width)

    def _amp_off(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.amp_off(), self.width)

    @usage(
        example="%amp on bf16",
        purpose="mixed precision: status, on, off",
        cell=CellUsage(_MODE_WORDS, "%%amp bf16", "one cell under autocast"),
    )
    @argument(
        "words",
        nargs="*",
        metavar=f"on|off {_MODE_WORDS}",
        help=f"line: on {_MODE_WORDS} | off | nothing for the status; cell: {_MODE_WORDS}",
    )
    @subcommands(
        Subcommand("", _amp_status, "the policy: dtype, device type, GradScaler, scale"),
        Subcommand(
            "on",
            _amp_on,
            "autocast for the session (auto: bf16 where supported, else fp16 on CUDA)",
            words=_MODE_WORDS,
            arity=(0, 1),
        ),
        Subcommand("off", _amp_off, "plain precision again; the scaler's state is kept"),
    )
    @line_cell_magic
    def amp(self, line: str, cell: str | None = None):
        """Mixed precision for the session: status (dtype, device type, GradScaler and its
        scale), on (auto: bf16 where supported, else fp16 on CUDA; bf16 on the CPU) or off
        (the scaler's state is kept).

        Cell: run just this cell under autocast, without changing the session's policy.
        """
        words = parse(self.amp, line).words
        if cell is not None:
            return self._cell_amp(words, cell)
        shown = self.dispatch(self.amp, words, argparse.Namespace())
        self._bind_scaler()
        self.show(shown)
        return None

    def _cell_amp(self, words: list[str], cell: str):
        with ExitStack() as stack:
            with self.refusals(self.amp):
                if len(words) > 1:
                    raise TorchMagicError("one precision at most", param="words")
                stack.enter_context(self.session.autocast(words[0] if words else "auto"))
            return self.shell.run_cell(cell).result

    def _bind_scaler(self) -> None:
        """Keep the user's ``scaler`` variable pointing at the session's GradScaler."""
        ns, name, scaler = self.shell.user_ns, self.settings.scaler_name, self.session.amp.scaler
        if scaler is not None:
            ns[name] = scaler
        elif type(ns.get(name)).__name__ == "GradScaler":
            del ns[name]

    @usage(
        "%fit train_loader --val val_loader --epochs 9 --unfreeze layer4,layer3",
        "train with its schedulers, live progress",
    )
    @MODEL_AND_TRAIN
    @argument(
        "--val",
        default=None,
        metavar="VAL_LOADER",
        help="validation loader: loss and accuracy after each epoch",
    )
    @argument("--epochs", type=int, default=1, metavar="N", help="epochs to train")
    @argument(
        "--max-steps", type=int, default=None, metavar="N", help="stop after N optimizer steps"
    )
    @LOSS
    @argument(
        "--cache-features",
        action="store_true",
        help="linear probing: run the frozen backbone once, train the head on its features",
    )
    @argument(
        "--sched-step",
        choices=("batch", "epoch"),
        default=None,
        help="step every scheduler per batch or per epoch (default: each one's own)",
    )
    @argument(
        "--unfreeze",
        default=None,
        metavar="BLOCKS",
        help="progressive unfreezing: blocks unfrozen one at a time, e.g. layer4,layer3,layer2",
    )
    @argument(
        "--every",
        type=int,
        default=None,
        metavar="N",
        help="unfreeze the next block every N epochs",
    )
    @argument(
        "--patience",
        type=int,
        default=None,
        metavar="P",
        help="unfreeze the next block after P epochs without improvement of the validation metric",
    )
    @argument(
        "--lr-ratio",
        type=float,
        default=FitOptions.lr_ratio,
        metavar="R",
        help="each unfrozen block's base lr: R x the previous one's (the first: R x the head's)",
    )
    @MONITOR
    @argument(
        "--early-stop",
        action="store_true",
        help="stop when the last block is unfrozen and the metric stalls for P more epochs",
    )
    @KEEP_BEST
    @METRIC
    @EXPORT
    @ACCUM
    @CLIP
    @OPT
    @line_magic
    def fit(self, line: str):
        """Train with the model's optimizer, its schedulers (OneCycleLR, CyclicLR, Hugging
        Face warmups and timm's step_update per batch, others per epoch, ReduceLROnPlateau
        on the validation loss) and the %amp policy, with live progress; returns the
        history and keeps it for %tm fits. --metric measures torchmetrics metrics on the
        validation data after each epoch; --export writes the weights for inference after
        the run."""
        args = parse(self.fit, line)

        def run(progress: Progress) -> object:
            model, train = self._model_and_loader(args.names)
            options = FitOptions(
                epochs=args.epochs,
                max_steps=args.max_steps,
                loss=args.loss,
                cache_features=args.cache_features,
                sched_step=args.sched_step,
                unfreeze=args.unfreeze or (),
                every=args.every,
                patience=args.patience,
                lr_ratio=args.lr_ratio,
                monitor=args.monitor,
                early_stop=args.early_stop,
                keep_best=args.keep_best,
                accumulate=args.accumulate,
                clip=args.clip,
                metric=args.metric or (),
                export=args.export,
            )
            return self.session.fit(
                train,
                model=model,
                val=args.val,
                options=options,
                optimizer=args.optimizer,
                observer=progress,
            )

        return self._shown(self.fit, run)

    @usage("%lr_find train_loader --apply", "the lr range test; all restored after")
    @MODEL_AND_TRAIN
    @argument("--start", type=float, default=LrFindOptions.start, metavar="LR", help="the first lr")
    @argument("--end", type=float, default=LrFindOptions.end, metavar="LR", help="the last lr")
    @argument(
        "--steps",
        type=int,
        default=LrFindOptions.steps,
        metavar="N",
        help="steps from start to end",
    )
    @argument(
        "--apply",
        action="store_true",
        help="set the head group's base lr to the suggestion, others in proportion (undoable)",
    )
    @LOSS
    @OPT
    @line_magic
    def lr_find(self, line: str):
        """The lr range test on what is trainable now: every group's lr grows together
        (ratios kept) until the smoothed loss passes 4x its minimum; shows the curve and a
        suggestion; afterwards weights, optimizer, schedulers, BatchNorm statistics, the
        scaler and the random state are exactly as before."""
        args = parse(self.lr_find, line)

        def run(progress: Progress) -> object:
            model, train = self._model_and_loader(args.names)
            options = LrFindOptions(args.start, args.end, args.steps, args.apply, args.loss)
            return self.session.lr_find(
                train,
                model=model,
                options=options,
                optimizer=args.optimizer,
                observer=progress,
            )

        return self._shown(self.lr_find, run)

    @usage(
        "%fine_tune train_loader --val val_loader --epochs 3 --lr 1e-3",
        "fastai's recipe: the head, then all",
    )
    @MODEL_AND_TRAIN
    @argument("--val", required=True, metavar="VAL_LOADER", help="the validation loader")
    @argument("--epochs", type=int, required=True, metavar="N", help="epochs with all unfrozen")
    @argument(
        "--freeze-epochs", type=int, default=1, metavar="N", help="epochs training the head only"
    )
    @argument(
        "--lr",
        type=float,
        default=None,
        metavar="X",
        help="the head's base lr; the body gets X/100..X (default: the head group's base lr)",
    )
    @argument(
        "--schedule",
        choices=SCHEDULES,
        default=None,
        help="one-cycle: a fresh OneCycleLR per phase (fastai's: head pct 0.99 div 25, "
        "unfrozen pct 0.3 div 5)",
    )
    @argument(
        "--bn",
        choices=POLICIES,
        default=None,
        help="the frozen body's BatchNorm in the head phase (train: fastai's train_bn; "
        "default: the session's policy)",
    )
    @METRIC
    @MONITOR
    @KEEP_BEST
    @EXPORT
    @ACCUM
    @CLIP
    @LOSS
    @OPT
    @line_magic
    def fine_tune(self, line: str):
        """fastai's recipe as the session's own commands, each in the history: freeze all
        but the head (--bn for its BatchNorm), fit --freeze-epochs, unfreeze every block at
        lr=X/100:X, fit --epochs; --schedule one-cycle runs each fit under its own
        OneCycleLR. --metric is measured in both fits, --keep-best keeps the second one's
        best epoch, --export writes the weights for inference at the end."""
        args = parse(self.fine_tune, line)

        def run(progress: Progress) -> object:
            model, train = self._model_and_loader(args.names)
            return self.session.fine_tune(
                train,
                val=args.val,
                epochs=args.epochs,
                freeze_epochs=args.freeze_epochs,
                lr=args.lr,
                model=model,
                loss=args.loss,
                optimizer=args.optimizer,
                observer=progress,
                accumulate=args.accumulate,
                clip=args.clip,
                schedule=args.schedule,
                bn=args.bn,
                metric=args.metric or (),
                monitor=args.monitor,
                keep_best=args.keep_best,
                export=args.export,
            )

        return self._shown(self.fine_tune, run)

    def _model_and_loader(self, names: list[str]) -> tuple[str | None, str]:
        """``[MODEL] TRAIN_LOADER``: the model variable (None: the current model), the loader."""
        if len(names) > 2:
            raise TorchMagicError(
                f"one model and one training loader, got {len(names)} words: {' '.join(names)}",
                param="names",
            )
        return (names[0], names[1]) if len(names) == 2 else (None, names[0])

    def _shown(self, magic: MagicFunction, run: Callable[[Progress], object]) -> ShownResult | None:
        """``run`` with live progress; its result then drawn where the progress was (also
        when the magic is not the cell's last line) and returned, shown once per cell
        (None where a terminal would echo it as an empty ``Out[n]:``). When ``run``
        fails the progress stays as the run left it."""
        progress = self._progress()
        try:
            with self.refusals(magic):
                result = run(progress)
        except BaseException:
            progress.finish()
            raise
        view = render.render(result, self.width)
        progress.finish(view)
        if echoed_in_a_terminal(self.shell, real_name(magic)):
            return None
        return ShownResult(view, self.shell)

    def _progress(self) -> Progress:
        """A live bar in a terminal; a display updated in place in a notebook."""
        if self.shell.__class__.__name__ == "TerminalInteractiveShell":
            return render.TerminalProgress(self.width)
        return render.NotebookProgress(lambda shown: display(shown, display_id=True), self.width)
