"""``%load_model``: a model built with weights, transforms and labels that match."""

from __future__ import annotations

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument

from .base import TopicMagics, parse, render
from .usage import usage


@magics_class
class ModelMagics(TopicMagics):
    """Building models the way their weights expect to be used."""

    @usage(
        "%load_model resnet18 --weights DEFAULT --num-classes 10",
        "a zoo model with its weights and labels",
    )
    @argument("name", metavar="NAME", help="resnet18, timm:convnext_atto, hf:vit, …")
    @argument(
        "--weights",
        default="DEFAULT",
        metavar="DEFAULT|NAME|none",
        help="the pretrained weights: DEFAULT, a named set such as IMAGENET1K_V2, or none",
    )
    @argument(
        "--num-classes",
        type=int,
        default=None,
        metavar="N",
        help="replace the head with one of N classes (an undoable history entry)",
    )
    @argument(
        "--as",
        dest="bind",
        default="model",
        metavar="VAR",
        help="the variable the model is bound to (default: model)",
    )
    @line_magic
    def load_model(self, line: str) -> None:
        """Build a model with the modern weights= API and bind it with `weights`,
        `preprocess = weights.transforms()` and `categories`, so transforms, input
        normalisation and labels match the weights; show the weights' metadata; replace
        the head with --num-classes. Offline without cached weights: one line saying so."""
        args = parse(self.load_model, line)
        weights = None if args.weights.lower() == "none" else args.weights
        with self.refusals(self.load_model):
            loaded, change = self.session.load_model(
                args.name,
                weights,
                num_classes=args.num_classes,
                bind=args.bind,
                head_command=f"%replace_head {args.bind} {args.num_classes}",
            )
        self.show(render.render(loaded, self.width))
        if change is not None:
            self.show(render.render(change, self.width))
