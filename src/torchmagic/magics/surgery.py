"""``%freeze``, ``%unfreeze``, ``%replace_head`` and ``%summary``: surgery on a live model."""

from __future__ import annotations

import re

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ..core import TorchMagicError
from ..core.surgery.batchnorm import POLICIES
from ..core.surgery.grammar import parse_count, parse_labels, parse_lr, parse_weight_decay
from .base import DRY_RUN, OPT, KeyOption, TopicMagics, key_options, parse, render, strip_comment

_COUNT = re.compile(r"^[+-]?[0-9]+$")  # a word that is meant as the class count N

LR = KeyOption(
    "lr",
    "lr=X | lr=A:B",
    parse_lr,
    "float | float:float",
    "unfreeze_lr_ratio x the head group's lr",
    "base lr of the new groups; A:B spreads A..B geometrically over the blocks",
)
LABELS = KeyOption(
    "labels",
    "labels=A,B,…",
    parse_labels,
    "names",
    "the model config's own labels, when it has them",
    "class names for a Hugging Face config's id2label / label2id; N defaults to their count",
)
WD = KeyOption(
    "wd",
    "wd=X",
    parse_weight_decay,
    "float",
    "the weight decay of the parameters' home groups",
    "weight decay of the new groups",
)


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


@magics_class
class SurgeryMagics(TopicMagics):
    """Freeze, unfreeze, replace the head, show the model: the optimizer, its state, the
    schedulers and BatchNorm kept consistent, every edit undoable."""

    @magic_arguments()
    @argument(
        "targets",
        nargs="*",
        metavar="TARGETS",
        help="modules: model.layer1-3, layer4, features.0-6, '*.bn*'",
    )
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
        """Stop training modules: requires_grad off, grads dropped, parameters out of the
        optimizer (state kept for undo), BatchNorm held in eval."""
        args = parse(self.freeze, line)
        with self.interrupts(f"%freeze {strip_comment(line).strip()}"):
            with self.refusals(self.freeze):
                if not args.targets and not args.exclude:
                    raise TorchMagicError("name what to freeze", param="targets")
                result = self.session.freeze(
                    *args.targets,
                    exclude=args.exclude,
                    bn=args.bn,
                    optimizer=args.optimizer,
                    dry_run=args.dry_run,
                    command=f"%freeze {strip_comment(line).strip()}",
                )
            self.show(render.render(result, self.width))

    @magic_arguments()
    @argument(
        "targets",
        nargs="*",
        metavar="TARGETS",
        help="modules, then optional lr=X | lr=A:B (geometric spread) and wd=X",
    )
    @_except("leave these frozen")
    @OPT
    @DRY_RUN
    @key_options(LR, WD)
    @line_magic
    def unfreeze(self, line: str) -> None:
        """Train modules again, each selected block in its own named param group; lr=A:B
        spreads lrs geometrically over the blocks."""
        args = parse(self.unfreeze, line)
        with self.interrupts(f"%unfreeze {strip_comment(line).strip()}"):
            with self.refusals(self.unfreeze):
                targets, options = self.split(self.unfreeze, args.targets)
                if not targets:
                    raise TorchMagicError("name what to unfreeze", param="targets")
                result = self.session.unfreeze(
                    *targets,
                    **options,
                    exclude=args.exclude,
                    optimizer=args.optimizer,
                    dry_run=args.dry_run,
                    command=f"%unfreeze {strip_comment(line).strip()}",
                )
            self.show(render.render(result, self.width))

    @magic_arguments()
    @argument(
        "spec",
        nargs="+",
        metavar="[TARGET|auto] N",
        help="where the head is (path, model, or auto), the number of classes, class names",
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
    @key_options(LABELS)
    @line_magic
    def replace_head(self, line: str) -> None:
        """Swap the classification head for a fresh Linear (or 1x1 Conv2d) with N outputs
        on the old head's device and dtype; the old parameters leave the optimizer, the
        new ones train in the old head's group."""
        args = parse(self.replace_head, line)
        with self.interrupts(f"%replace_head {strip_comment(line).strip()}"):
            with self.refusals(self.replace_head):
                spec, options = self.split(self.replace_head, args.spec)
                labels = options.get("labels")
                if len(spec) > 2 or not spec and labels is None:
                    raise TorchMagicError("one head and one class count", param="spec")
                if len(spec) == 2 or spec and _COUNT.match(spec[-1]):
                    where, count = ["auto", *spec] if len(spec) == 1 else spec
                else:
                    where, count = (spec[0] if spec else "auto"), None
                if count is None and labels is None:
                    raise TorchMagicError(
                        f"the number of classes is missing after '{where}'", param="num_classes"
                    )
                result = self.session.replace_head(
                    where,
                    None if count is None else parse_count(count, "num_classes"),
                    labels=labels,
                    dropout=args.dropout,
                    optimizer=args.optimizer,
                    dry_run=args.dry_run,
                    command=f"%replace_head {strip_comment(line).strip()}",
                )
            self.show(render.render(result, self.width))

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
        """A bounded table of modules: parameters, trainable/frozen/partial, BatchNorm mode,
        optimizer group and lr, with totals in bytes."""
        args = parse(self.summary, line)
        with self.refusals(self.summary):
            report = self.session.summary(args.where, depth=args.depth)
        self.show(render.render(report, self.width))
