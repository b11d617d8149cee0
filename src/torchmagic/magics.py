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
from .core.amp import MODES, cell_autocast
from .core.batchnorm import POLICIES
from .core.grammar import split_options
from .manifest import load_manifest

KEY_OPTIONS = {"freeze": (), "unfreeze": ("lr", "wd"), "replace_head": (), "summary": ()}
TM_ACTIONS = ("history", "undo", "use", "fits", "help")
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
    @argument("action", choices=TM_ACTIONS, help="history | undo | use NAME | fits | help")
    @argument("name", nargs="?", default=None, help="the model variable, for `use`")
    @line_magic
    def tm(self, line: str) -> None:
        """Session commands: history, undo, use NAME, fits, help."""
        args = _parse(self.tm, line)
        self._sync_namespace()
        with usage_errors():
            if args.action != "use" and args.name is not None:
                raise TorchMagicError(f"%tm {args.action} takes no argument")
            if args.action == "history":
                shown = render.history(self.session.history(), self.width)
            elif args.action == "undo":
                shown = render.change(self.session.undo(), self.width)
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
