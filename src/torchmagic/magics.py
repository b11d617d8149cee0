"""The notebook layer: one ``Magics`` class that parses a line, finds names in the
user namespace, calls the engine and displays what the render layer draws.

No torch logic lives here. Bad input surfaces as IPython's ``UsageError``: one line,
no traceback, nothing changed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display
from IPython.utils.process import arg_split
from traitlets import Enum, Float, Integer, Unicode, observe

from . import render
from .core import Session, SessionConfig, TorchMagicError
from .core.devices import device as devices
from .core.devices import estimate, memory, pinbench, placement
from .core.diagnostics import doctor
from .core.diagnostics.compiled import CompileWatch
from .core.surgery.batchnorm import POLICIES
from .core.surgery.grammar import parse_shape, split_options
from .core.training.amp import MODES, cell_autocast
from .manifest import load_manifest
from .render import device as device_render
from .render import doctor as doctor_render
from .render import memory as memory_render

KEY_OPTIONS = {"freeze": (), "unfreeze": ("lr", "wd"), "replace_head": (), "summary": ()}
TM_ACTIONS = ("history", "undo", "use", "fits", "doctor", "help")
DEVICE_ACTIONS = ("move", "check", "pinbench")
GPUMEM_ACTIONS = ("reset", "watch", "estimate")
_INT = re.compile(r"^[+-]?\d+$")


def _except(help_text: str) -> argument:
    return argument(
        "--except",
        dest="exclude",
        nargs="+",
        action="extend",
        default=[],
        metavar="T",
        help=help_text,
    )


# Options shared by the mutating magics (one decorator object serves each of them).
OPT = argument(
    "--opt",
    default=None,
    metavar="NAME",
    help="the optimizer variable (default: the one holding the model's parameters)",
)
DRY_RUN = argument("--dry-run", action="store_true", help="show what would change, change nothing")


@contextmanager
def usage_errors() -> Iterator[None]:
    """Turn the engine's refusals into exactly ``UsageError`` (IPython hides its traceback)."""
    try:
        yield
    except TorchMagicError as error:
        raise UsageError(str(error)) from None


def _parse(func: Callable, line: str):
    """argparse over shell-like tokens; options and targets may be interleaved."""
    return func.parser.parse_intermixed_args(arg_split(line, posix=True))


@magics_class
class TorchMagics(Magics):
    """Transfer-learning magics over a live PyTorch model (``%load_ext torchmagic``)."""

    bn_policy = Enum(
        POLICIES,
        default_value="eval",
        help="BatchNorm policy for frozen blocks: eval (stats frozen), train, frozen (swap).",
    ).tag(config=True)
    unfreeze_lr_ratio = Float(
        0.1, help="Default %unfreeze lr as a fraction of the head group's lr."
    ).tag(config=True)
    width = Integer(100, help="Width of the rendered output in characters.").tag(config=True)
    summary_depth = Integer(2, help="Default depth of %summary.").tag(config=True)
    summary_max_rows = Integer(60, help="Rows %summary shows before it collapses.").tag(config=True)
    scaler_name = Unicode(
        "scaler", help="User variable that %amp on fp16 binds the session's GradScaler to."
    ).tag(config=True)

    def __init__(self, shell=None, **kwargs) -> None:
        super().__init__(shell=shell, **kwargs)
        self.session = Session(
            namespace=shell.user_ns, hidden=shell.user_ns_hidden, config=self._session_config()
        )
        self.compile_watch = CompileWatch()
        self.cell_watcher: memory.CellWatcher | None = None
        shell.events.register("post_run_cell", self._observe_compiled)

    def close(self) -> None:
        """Unhook from the shell's events (``%unload_ext``)."""
        self._watch(False)
        self.shell.events.unregister("post_run_cell", self._observe_compiled)

    def _observe_compiled(self, result=None) -> None:
        """Remember compiled models as first seen, so doctor can tell later edits."""
        self.compile_watch.observe(self.shell.user_ns, self.shell.user_ns_hidden)

    def _session_config(self) -> SessionConfig:
        return SessionConfig(
            bn_policy=self.bn_policy,
            unfreeze_lr_ratio=self.unfreeze_lr_ratio,
            summary_depth=self.summary_depth,
            summary_max_rows=self.summary_max_rows,
        )

    @observe("bn_policy", "unfreeze_lr_ratio", "summary_depth", "summary_max_rows")
    def _settings_changed(self, change) -> None:
        if hasattr(self, "session"):
            self.session.config = self._session_config()

    def _show(self, rendered: render.Rendered) -> None:
        display(rendered)

    def _sync_namespace(self) -> None:
        self.session.workspace.namespace = self.shell.user_ns

    # -- surgery ---------------------------------------------------------------------

    @magic_arguments()
    @argument("targets", nargs="*", help="modules: model.layer1-3, layer4, features.0-6, '*.bn*'")
    @_except("keep these trainable")
    @argument(
        "--bn",
        choices=POLICIES,
        default=None,
        help="BatchNorm policy for the frozen blocks (default: TorchMagics.bn_policy)",
    )
    @OPT
    @DRY_RUN
    @line_magic
    def freeze(self, line: str) -> None:
        """Freeze modules: requires_grad off, out of the optimizer, BatchNorm held."""
        args = _parse(self.freeze, line)
        self._sync_namespace()
        with usage_errors():
            targets, _ = split_options(args.targets, KEY_OPTIONS["freeze"])
            if not targets and not args.exclude:
                raise TorchMagicError("name what to freeze, e.g. %freeze model.layer1-3")
            result = self.session.freeze(
                *targets,
                exclude=args.exclude,
                bn=args.bn,
                optimizer=args.opt,
                dry_run=args.dry_run,
                command=f"%freeze {line.strip()}",
            )
        self._show(render.change(result, self.width))

    @magic_arguments()
    @argument(
        "targets",
        nargs="*",
        help="modules, then optional lr=X | lr=A:B (geometric spread) and wd=X",
    )
    @_except("leave these frozen")
    @OPT
    @DRY_RUN
    @line_magic
    def unfreeze(self, line: str) -> None:
        """Unfreeze modules into their own param groups at the given (or default) lr."""
        args = _parse(self.unfreeze, line)
        self._sync_namespace()
        with usage_errors():
            targets, options = split_options(args.targets, KEY_OPTIONS["unfreeze"])
            if not targets:
                raise TorchMagicError("name what to unfreeze, e.g. %unfreeze layer4 lr=1e-4")
            result = self.session.unfreeze(
                *targets,
                lr=options.get("lr"),
                wd=options.get("wd"),
                exclude=args.exclude,
                optimizer=args.opt,
                dry_run=args.dry_run,
                command=f"%unfreeze {line.strip()}",
            )
        self._show(render.change(result, self.width))

    @magic_arguments()
    @argument(
        "spec",
        nargs="+",
        metavar="[TARGET|auto] N",
        help="where the head is (path, model, or auto) and the number of classes",
    )
    @argument(
        "--dropout",
        type=float,
        default=None,
        metavar="P",
        help="put Dropout(P) in front of the new layer",
    )
    @OPT
    @DRY_RUN
    @line_magic
    def replace_head(self, line: str) -> None:
        """Swap the classification head for a fresh layer with N outputs."""
        args = _parse(self.replace_head, line)
        self._sync_namespace()
        with usage_errors():
            if len(args.spec) > 2:
                raise TorchMagicError("usage: %replace_head [TARGET|auto] N")
            where, count = ["auto", *args.spec] if len(args.spec) == 1 else args.spec
            if not _INT.match(count):
                raise TorchMagicError(f"N must be a whole number of classes, got '{count}'")
            result = self.session.replace_head(
                where,
                int(count),
                dropout=args.dropout,
                optimizer=args.opt,
                dry_run=args.dry_run,
                command=f"%replace_head {line.strip()}",
            )
        self._show(render.change(result, self.width))

    # -- inspection ------------------------------------------------------------------

    @magic_arguments()
    @argument(
        "where",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="a model variable or a path inside it (default: the current model)",
    )
    @argument(
        "--depth",
        type=int,
        default=None,
        metavar="N",
        help="how deep the tree goes (default: TorchMagics.summary_depth)",
    )
    @line_magic
    def summary(self, line: str) -> None:
        """Modules with parameter counts, trainable state, BatchNorm mode, group and lr."""
        args = _parse(self.summary, line)
        self._sync_namespace()
        with usage_errors():
            report = self.session.summary(args.where, depth=args.depth)
        self._show(render.summary(report, self.width))

    @magic_arguments()
    @argument("action", choices=TM_ACTIONS, help="history | undo | use NAME | fits | doctor | help")
    @argument("name", nargs="?", default=None, help="the model variable, for `use`")
    @line_magic
    def tm(self, line: str) -> None:
        """Session commands: history, undo, use NAME, fits, doctor, help."""
        args = _parse(self.tm, line)
        self._sync_namespace()
        with usage_errors():
            if args.action != "use" and args.name is not None:
                raise TorchMagicError(f"%tm {args.action} takes no argument")
            if args.action == "history":
                shown = render.history(self.session.history(), self.width)
            elif args.action == "undo":
                shown = render.change(self.session.undo(), self.width)
            elif args.action == "doctor":
                shown = doctor_render.doctor(
                    doctor.diagnose(
                        self.shell.user_ns,
                        hidden=self.shell.user_ns_hidden,
                        amp=self.session.amp,
                        compile_watch=self.compile_watch,
                        device=self.session.device,
                    ),
                    self.width,
                )
            elif args.action == "fits":
                shown = render.fits(self.session.fits, self.width)
            elif args.action == "use":
                if args.name is None:
                    raise TorchMagicError("usage: %tm use NAME")
                shown = render.message(f"current model: {self.session.use(args.name)}", self.width)
            else:
                shown = render.manifest_help(load_manifest(), self.width)
        self._show(shown)

    # -- training --------------------------------------------------------------------

    @magic_arguments()
    @argument(
        "words",
        nargs="*",
        metavar="on|off [auto|bf16|fp16]",
        help="line: on [auto|bf16|fp16] | off | nothing for the status; cell: [auto|bf16|fp16]",
    )
    @line_cell_magic
    def amp(self, line: str, cell: str | None = None):
        """Mixed precision: status, on/off for the session, or one cell under autocast."""
        words = _parse(self.amp, line).words
        self._sync_namespace()
        with usage_errors():
            if cell is not None:
                if len(words) > 1 or (words and words[0] not in MODES):
                    raise TorchMagicError("usage: %%amp [auto|bf16|fp16]")
                context = cell_autocast(
                    self.session.amp, words[0] if words else None, self.session.device_type()
                )
            elif not words:
                status = self.session.amp.status()
            elif words[0] == "on" and len(words) <= 2:
                status = self.session.amp_on(words[1] if len(words) == 2 else "auto")
            elif words == ["off"]:
                status = self.session.amp.turn_off()
            else:
                raise TorchMagicError("usage: %amp [on [auto|bf16|fp16] | off]")
        if cell is not None:
            with context:
                return self.shell.run_cell(cell).result
        self._bind_scaler()
        self._show(render.amp_status(status, self.width))
        return None

    def _bind_scaler(self) -> None:
        """Keep the user's ``scaler`` variable pointing at the session's GradScaler."""
        ns, name, scaler = self.shell.user_ns, self.scaler_name, self.session.amp.scaler
        if scaler is not None:
            ns[name] = scaler
        elif type(ns.get(name)).__name__ == "GradScaler":
            del ns[name]

    @magic_arguments()
    @argument(
        "names",
        nargs="+",
        metavar="[MODEL] TRAIN_LOADER",
        help="the model variable (default: the current model) and the training loader",
    )
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
    @argument(
        "--loss",
        default="cross_entropy",
        metavar="NAME",
        help="cross_entropy, nll, bce, mse, l1, smooth_l1, huber, or a callable variable",
    )
    @argument(
        "--cache-features",
        action="store_true",
        help="linear probing: run the frozen backbone once, train the head on its features",
    )
    @OPT
    @line_magic
    def fit(self, line: str):
        """Train with the model's optimizer, schedulers and AMP policy, with live progress."""
        args = _parse(self.fit, line)
        self._sync_namespace()
        with usage_errors():
            if len(args.names) > 2:
                raise TorchMagicError("usage: %fit [MODEL] TRAIN_LOADER [--val VAL_LOADER] …")
            model, train = args.names if len(args.names) == 2 else [None, *args.names]
            if self.shell.__class__.__name__ == "TerminalInteractiveShell":
                observer = render.TerminalProgress(self.width)
            else:
                observer = render.NotebookProgress(
                    lambda shown: display(shown, display_id=True), self.width
                )
            history = self.session.fit(
                train,
                model=model,
                val=args.val,
                epochs=args.epochs,
                max_steps=args.max_steps,
                loss=args.loss,
                cache_features=args.cache_features,
                optimizer=args.opt,
                observer=observer,
            )
        return render.fit_history(history, self.width)

    # -- device and memory -----------------------------------------------------------

    @magic_arguments()
    @argument(
        "words",
        nargs="*",
        metavar="cuda:N|cpu|mps|auto | move|check [MODEL] | pinbench LOADER",
        help="nothing: list devices; a device: set the session's device; move, check or pinbench",
    )
    @line_magic
    def device(self, line: str) -> None:
        """Devices: list them, pick the session's, move a model with its optimizer state,
        find misplaced tensors, time host-to-device copies."""
        words = _parse(self.device, line).words
        self._sync_namespace()
        session = self.session
        with usage_errors():
            action, rest = (words[0], words[1:]) if words else (None, [])
            if action in DEVICE_ACTIONS and len(rest) > 1 or action not in DEVICE_ACTIONS and rest:
                raise TorchMagicError(
                    "usage: %device [cuda:N|cpu|mps|auto] | move [MODEL] | check [MODEL] | "
                    "pinbench LOADER"
                )
            if action is None:
                shown = device_render.devices(devices.list_devices(session.device), self.width)
            elif action == "move":
                bound = session.bound(rest[0] if rest else None)
                target = session.device or devices.resolve_device("auto")
                report = devices.move(
                    bound.model,
                    target,
                    bound.optimizer,
                    session.amp.scaler,
                    model_name=bound.model_name,
                )
                session.device = target
                shown = device_render.moved(report, self.width)
            elif action == "check":
                bound = session.bound(rest[0] if rest else None)
                report = placement.find_misplaced(
                    bound.model,
                    bound.optimizer,
                    session.amp.scaler,
                    model_name=bound.model_name,
                    optimizer_name=bound.optimizer_name or "optimizer",
                )
                shown = device_render.misplaced(report, self.width)
            elif action == "pinbench":
                if not rest:
                    raise TorchMagicError("usage: %device pinbench LOADER")
                if rest[0] not in self.shell.user_ns:
                    raise TorchMagicError(f"no variable named '{rest[0]}'")
                report = pinbench.pinbench(self.shell.user_ns[rest[0]], session.device)
                shown = device_render.pin_report(report, self.width)
            else:
                session.device = devices.resolve_device(action)
                shown = device_render.devices(devices.list_devices(session.device), self.width)
        self._show(shown)

    @magic_arguments()
    @argument(
        "words",
        nargs="*",
        metavar="reset | watch on|off | estimate [MODEL]",
        help="nothing: the memory breakdown; reset, watch on|off or estimate [MODEL]",
    )
    @argument(
        "--tracebacks",
        action="store_true",
        help="with reset: drop the last traceback, which can pin tensors",
    )
    @argument(
        "--input-shape",
        default=None,
        metavar="N,C,H,W",
        help="with estimate: also measure activations of one forward pass",
    )
    @argument(
        "--optimizer",
        default=None,
        metavar="CLASS",
        help="with estimate: an optimizer class to estimate for, e.g. AdamW",
    )
    @line_magic
    def gpumem(self, line: str) -> None:
        """Memory: allocator figures and a breakdown by parameters, gradients, optimizer
        state and the rest; peak reset; per-cell watch; training-step estimate."""
        args = _parse(self.gpumem, line)
        words = args.words
        self._sync_namespace()
        with usage_errors():
            action, rest = (words[0], words[1:]) if words else (None, [])
            if action is not None and action not in GPUMEM_ACTIONS:
                raise TorchMagicError(
                    "usage: %gpumem [reset [--tracebacks] | watch on|off | "
                    "estimate [MODEL] [--input-shape N,C,H,W]]"
                )
            if action is None:
                try:
                    bound = self.session.bound()
                except TorchMagicError:  # no model (yet): the device figures alone
                    report = memory.breakdown(None)
                else:
                    report = memory.breakdown(
                        bound.model, bound.optimizer, model_name=bound.model_name
                    )
                shown = memory_render.memory(report, self.width)
            elif action == "reset":
                shown = memory_render.reset(memory.reset_peaks(args.tracebacks), self.width)
            elif action == "watch":
                if rest not in (["on"], ["off"]):
                    raise TorchMagicError("usage: %gpumem watch on|off")
                self._watch(rest == ["on"])
                shown = render.message(f"memory watch {rest[0]}", self.width)
            else:
                bound = self.session.bound(rest[0] if rest else None)
                shape = parse_shape(args.input_shape) if args.input_shape else None
                report = estimate.estimate(
                    bound.model,
                    args.optimizer or bound.optimizer,
                    shape,
                    model_name=bound.model_name,
                )
                shown = memory_render.estimate(report, self.width)
        self._show(shown)

    def _watch(self, on: bool) -> None:
        events = self.shell.events
        if on and self.cell_watcher is None:
            self.cell_watcher = memory.CellWatcher()
            events.register("pre_run_cell", self._watch_pre)
            events.register("post_run_cell", self._watch_post)
        elif not on and self.cell_watcher is not None:
            events.unregister("pre_run_cell", self._watch_pre)
            events.unregister("post_run_cell", self._watch_post)
            self.cell_watcher = None

    def _watch_pre(self, info=None) -> None:
        self.cell_watcher.pre()

    def _watch_post(self, result=None) -> None:
        cell = self.cell_watcher.post()
        if cell is not None:
            print(memory_render.cell_line(cell))
