"""``%freeze``, ``%unfreeze``, ``%replace_head``, ``%lora`` and ``%summary``: surgery on a
live model."""

from __future__ import annotations

import argparse
import re
import shlex
from functools import partial

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument

from ..core import (
    FreezeOptions,
    LoraOptions,
    ReplaceHeadOptions,
    TorchMagicError,
    UnfreezeOptions,
)
from ..core.choices import POLICIES
from ..core.surgery.grammar import (
    parse_count,
    parse_labels,
    parse_lr,
    parse_positive_float,
    parse_shape,
    parse_weight_decay,
)
from .base import DRY_RUN, OPT, TopicMagics, parse, render, strip_comment
from .usage import KeyOption, Subcommand, key_options, subcommands, usage

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
    "class names, kept for %evaluate and %predict (and in a Hugging Face config's "
    "id2label / label2id); N defaults to their count",
)
WD = KeyOption(
    "wd",
    "wd=X",
    parse_weight_decay,
    "float",
    "the weight decay of the parameters' home groups",
    "weight decay of the new groups",
)

LORA_R = KeyOption("r", "r=N", partial(parse_count, key="r"), "int", "8", "the adapters' rank")
LORA_ALPHA = KeyOption(
    "alpha",
    "alpha=X",
    partial(parse_positive_float, key="alpha"),
    "float",
    "16",
    "the adapters' scale is alpha / r",
)
LORA_DROPOUT = KeyOption(
    "dropout",
    "dropout=P",
    partial(parse_positive_float, key="dropout", allow_zero=True),
    "float",
    "0",
    "dropout on the adapters' input",
)
LORA_LR = KeyOption(
    "lr",
    "lr=X",
    partial(parse_positive_float, key="lr"),
    "float",
    "the head group's base lr",
    "base lr of the adapters' group",
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

    @usage("%freeze model.layer1-3", "stop training modules; the optimizer follows")
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
                    options=FreezeOptions(tuple(args.exclude or ()), args.bn),
                    optimizer=args.optimizer,
                    dry_run=args.dry_run,
                    command=f"%freeze {strip_comment(line).strip()}",
                )
            self.show(render.render(result, self.width))

    @usage("%unfreeze layer3-4 lr=1e-5:1e-4", "train modules again, in their own lr groups")
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
                    options=UnfreezeOptions(**options, exclude=tuple(args.exclude or ())),
                    optimizer=args.optimizer,
                    dry_run=args.dry_run,
                    command=f"%unfreeze {strip_comment(line).strip()}",
                )
            self.show(render.render(result, self.width))

    @usage("%replace_head auto 10", "a fresh classification head with N outputs")
    @argument(
        "spec",
        nargs="+",
        metavar="[TARGET|auto] [N]",
        help="where the head is (path, model, or auto) and the number of classes (default: "
        "the class folders of the data loaded for the model)",
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
                if len(spec) > 2:
                    raise TorchMagicError(
                        f"one head and one class count, e.g. fc 10, got {' '.join(spec)}",
                        param="spec",
                    )
                if len(spec) == 2 or spec and _COUNT.match(spec[-1]):
                    where, count = ["auto", *spec] if len(spec) == 1 else spec
                else:
                    where, count = (spec[0] if spec else "auto"), None
                result = self.session.replace_head(
                    where,
                    options=ReplaceHeadOptions(
                        None if count is None else parse_count(count, "num_classes"),
                        args.dropout,
                        None if labels is None else tuple(labels),
                    ),
                    optimizer=args.optimizer,
                    dry_run=args.dry_run,
                    command=f"%replace_head {strip_comment(line).strip()}",
                )
            self.show(render.render(result, self.width))

    # -- %lora subcommands: one Session call each, rendered ---------------------------

    def _lora_add(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        targets, options = self.split(self.lora, words)
        if not targets:
            raise TorchMagicError("name the layers to adapt", param="targets")
        result = self.session.lora(
            *targets,
            options=LoraOptions(**options, use_dora=args.use_dora, use_rslora=args.use_rslora),
            optimizer=args.optimizer,
            dry_run=args.dry_run,
            command=f"%lora {shlex.join(words)}",  # globs quoted, as typed
        )
        return render.render(result, self.width)

    def _lora_merge(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        result = self.session.merge_lora(
            *words,
            optimizer=args.optimizer,
            dry_run=args.dry_run,
            command=" ".join(["%lora merge", *words]),
        )
        return render.render(result, self.width)

    def _lora_off(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        command = " ".join(["%lora off", *words])
        return render.render(self.session.lora_off(*words, command=command), self.width)

    def _lora_on(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        command = " ".join(["%lora on", *words])
        return render.render(self.session.lora_on(*words, command=command), self.width)

    @usage('%lora "blocks.*.attn.qkv" r=8 lr=1e-3', "LoRA adapters on layers; merge, off, on")
    @argument(
        "words",
        nargs="*",
        metavar="TARGETS | merge | off | on",
        help="layers to adapt (paths, globs, or peft's name endings q_proj,v_proj), then "
        "optional r=N alpha=X dropout=P lr=X; or merge, off, on",
    )
    @argument(
        "--dora",
        dest="use_dora",
        action="store_true",
        help="DoRA: a trained magnitude per output beside the low-rank direction (peft's use_dora)",
    )
    @argument(
        "--rslora",
        dest="use_rslora",
        action="store_true",
        help="rank-stabilised scale alpha / sqrt(r) instead of alpha / r (peft's use_rslora)",
    )
    @OPT
    @DRY_RUN
    @key_options(LORA_R, LORA_ALPHA, LORA_DROPOUT, LORA_LR)
    @subcommands(
        Subcommand(
            "merge",
            _lora_merge,
            "fold the adapters into the weights: layers as before, adapters out of the optimizer",
            words="[MODEL]",
            arity=(0, 1),
            options=("--opt", "--dry-run"),
        ),
        Subcommand("off", _lora_off, "the model without its adapters (kept)", "[MODEL]", (0, 1)),
        Subcommand("on", _lora_on, "the adapters contribute again", "[MODEL]", (0, 1)),
        other=Subcommand(
            "*",
            _lora_add,
            "add LoRA adapters to the Linear / Conv1D / Conv2d / Embedding layers named or inside",
            words="TARGETS [r=N] [alpha=X] [dropout=P] [lr=X]",
            arity=(1, 1000),
            options=("--dora", "--rslora", "--opt", "--dry-run"),
        ),
    )
    @line_magic
    def lora(self, line: str) -> None:
        """Low-rank adapters (peft's LoRA layers; DoRA, rsLoRA) on the Linear / Conv1D /
        Conv2d / Embedding layers, in place: their base weights freeze and leave the optimizer
        (state kept for undo), the adapters train in a new group lora at base lr X (default:
        the head group's), outputs unchanged. Targets as peft writes them work too: q_proj,v_proj
        (or a name that is no path, c_attn) adapts every module whose path ends so. merge
        folds them into the weights, off/on switch them; each undoable."""
        args = parse(self.lora, line)
        with self.interrupts(f"%lora {strip_comment(line).strip()}"):
            self.show(self.dispatch(self.lora, args.words, args))

    @usage(
        "%summary model --depth 1 --input-shape 1,3,224,224", "the module table, output shapes too"
    )
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
    @argument(
        "--input-shape",
        "--input-size",
        dest="input_shape",
        default=None,
        metavar="SHAPE",
        help="an input's shape, batch first (1,3,224,224): each module's output shape and "
        "bytes, from one forward on the meta device",
    )
    @line_magic
    def summary(self, line: str) -> None:
        """A bounded table of modules: parameters, trainable/frozen/partial, BatchNorm mode,
        optimizer group and lr, with totals in bytes; with --input-shape, each module's
        output shape and bytes (one forward on the meta device: no memory, no arithmetic)."""
        args = parse(self.summary, line)
        with self.refusals(self.summary):
            shape = parse_shape(args.input_shape) if args.input_shape else None
            report = self.session.summary(args.where, depth=args.depth, input_shape=shape)
        self.show(render.render(report, self.width))
