"""``%device`` and ``%gpumem``: where the model lives and what memory it takes."""

from __future__ import annotations

import argparse

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument

from ..core import TorchMagicError
from ..core.surgery.grammar import parse_bytes, parse_shape
from .base import OPT, TopicMagics, parse, render
from .usage import Subcommand, subcommands, usage


@magics_class
class DeviceMagics(TopicMagics):
    """Devices, moves that keep optimizer state in step, misplaced tensors, memory."""

    def __init__(self, shell, settings) -> None:
        super().__init__(shell, settings)
        self.watching = False  # %gpumem watch on: the session's cell watch is hooked

    def close(self) -> None:
        self._watch(False)

    # -- subcommands: one Session call each, rendered (the tables below list them) ---

    def _devices(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.devices(), self.width)

    def _set_device(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.set_device(words[0]), self.width)

    def _move(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.move(*words), self.width)

    def _check(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.check(*words), self.width)

    def _pinbench(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.pinbench(words[0]), self.width)

    def _compare(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        model, loader = words if len(words) == 2 else [None, *words]
        report = self.session.compare_devices(
            loader, model=model, optimizer=args.optimizer, loss=args.loss, steps=args.steps
        )
        return render.render(report, self.width)

    def _memory(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.memory(), self.width)

    def _reset(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.reset_peaks(args.tracebacks), self.width)

    def _estimate(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        shape = parse_shape(args.input_shape) if args.input_shape else None
        report = self.session.estimate(
            *words, optimizer_class=args.optimizer_class, input_shape=shape
        )
        return render.render(report, self.width)

    def _batch(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        report = self.session.batch_size(
            parse_shape(args.input_shape),
            model=words[0] if words else None,
            budget=parse_bytes(args.budget) if args.budget else None,
            max_batch=args.max,
            effective_batch=args.effective_batch,
        )
        return render.render(report, self.width)

    def _watch_switch(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        if words[0] not in ("on", "off"):
            raise TorchMagicError(f"watch takes on or off, got '{words[0]}'", param="words")
        self._watch(words[0] == "on")
        return render.render(f"memory watch {words[0]}", self.width)

    @usage("%device move", "devices; move a model with its state")
    @argument(
        "words",
        nargs="*",
        metavar="cuda:N|cpu|mps|auto | move|check [MODEL] | pinbench|compare [MODEL] LOADER",
        help="nothing: list devices; a device: set the session's device; move, check, "
        "pinbench or compare",
    )
    @argument(
        "--steps",
        type=int,
        default=5,
        metavar="N",
        help="with compare: timed training steps per device",
    )
    @argument(
        "--loss",
        default="cross_entropy",
        metavar="NAME",
        help="with compare: the loss, as for fit (default: cross_entropy)",
    )
    @OPT
    @subcommands(
        Subcommand("", _devices, "every device (name, capability, memory, bf16) and the session's"),
        Subcommand(
            "move",
            _move,
            "move a model with its optimizer state and GradScaler to the session's device",
            words="[MODEL]",
            arity=(0, 1),
        ),
        Subcommand(
            "check",
            _check,
            "list tensors not where the model's parameters are, with the fix",
            words="[MODEL]",
            arity=(0, 1),
        ),
        Subcommand(
            "pinbench",
            _pinbench,
            "time pageable vs pinned host-to-device copies of one batch",
            words="LOADER",
            arity=(1, 1),
        ),
        Subcommand(
            "compare",
            _compare,
            "time a few training steps of copies of the model on the CPU and each accelerator",
            words="[MODEL] LOADER",
            arity=(1, 2),
            options=("--steps", "--loss", "--opt"),
        ),
        other=Subcommand(
            "*",
            _set_device,
            "make this the session's device",
            words="cuda:N|cpu|mps|auto",
            arity=(1, 1),
        ),
    )
    @line_magic
    def device(self, line: str) -> None:
        """List every device (name, capability, free/total memory, bf16) and the session's;
        set the session's device; move a model with its optimizer state and GradScaler
        (bytes reported, references kept); list tensors not where the model's parameters
        are (unregistered tensor attributes too) with the fix; time pageable vs pinned
        host-to-device copies of one batch; time training steps of copies of the model on
        the CPU and each accelerator (measure before moving)."""
        args = parse(self.device, line)
        self.show(self.dispatch(self.device, args.words, args))

    @usage(
        "%gpumem estimate --input-shape 8,3,224,224", "memory now, a step's peak, the best batch"
    )
    @argument(
        "words",
        nargs="*",
        metavar="reset | watch on|off | estimate [MODEL] | batch [MODEL]",
        help="nothing: the memory breakdown; reset, watch on|off, estimate or batch [MODEL]",
    )
    @argument(
        "--tracebacks",
        action="store_true",
        help="with reset: drop the last traceback, which can pin tensors",
    )
    @argument(
        "--input-shape",
        default=None,
        metavar="SHAPE",
        help="with estimate: the batch's shape, to predict the step's peak; with batch: one "
        "sample's shape (C,H,W)",
    )
    @argument(
        "--max",
        type=int,
        default=None,
        metavar="N",
        help="with batch: the largest batch size worth considering",
    )
    @argument(
        "--budget",
        default=None,
        metavar="SIZE",
        help="with batch on the CPU: memory for the whole training setup, e.g. 8GiB "
        "(default: the RAM available)",
    )
    @argument(
        "--effective-batch",
        type=int,
        default=None,
        metavar="N",
        help="with batch: the samples wanted per optimizer step; says which --accum and batch "
        "size reach them",
    )
    @argument(
        "--optimizer",
        dest="optimizer_class",
        default=None,
        metavar="CLASS",
        help="with estimate: an optimizer class to estimate for, e.g. AdamW",
    )
    @subcommands(
        Subcommand("", _memory, "the breakdown of the current model's memory"),
        Subcommand(
            "reset",
            _reset,
            "start the peak counters again",
            options=("--tracebacks",),
        ),
        Subcommand(
            "watch", _watch_switch, "a one-line memory report after every cell", "on|off", (1, 1)
        ),
        Subcommand(
            "estimate",
            _estimate,
            "the bytes a training step will need",
            words="[MODEL]",
            arity=(0, 1),
            options=("--input-shape", "--optimizer"),
        ),
        Subcommand(
            "batch",
            _batch,
            "the largest batch whose training step fits on the session's device",
            words="[MODEL]",
            arity=(0, 1),
            options=("--input-shape", "--max", "--budget", "--effective-batch"),
            required=("--input-shape",),
        ),
    )
    @line_magic
    def gpumem(self, line: str) -> None:
        """Memory in use, reserved, peak and free/total with a breakdown into
        trainable/frozen parameters, gradients, optimizer state and the rest (allocator
        statistics on CUDA, tensor walk and RSS on the CPU); reset the peaks; a one-line
        memory report after every cell; the peak a training step will reach; the largest
        batch whose training step fits."""
        args = parse(self.gpumem, line)
        self.show(self.dispatch(self.gpumem, args.words, args))

    # -- the per-cell watch (IPython events) -----------------------------------------

    def _watch(self, on: bool) -> None:
        events = self.shell.events
        if on and not self.watching:
            events.register("pre_run_cell", self._watch_pre)
            events.register("post_run_cell", self._watch_post)
        elif not on and self.watching:
            events.unregister("pre_run_cell", self._watch_pre)
            events.unregister("post_run_cell", self._watch_post)
            self.session.cell_watch.stop()
        self.watching = on

    def _watch_pre(self, _info=None) -> None:
        if self.watching:
            self.session.cell_watch.pre()

    def _watch_post(self, result=None) -> None:
        cell = self.session.cell_watch.post() if self.watching else None
        if cell is not None:
            print(render.memory.cell_line(cell))
