"""``%load_data``: a folder of class folders as loaders that match the model's weights."""

from __future__ import annotations

from typing import Any

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument

from ..core import TorchMagicError
from .base import TopicMagics, parse, render
from .usage import usage


@magics_class
class DataMagics(TopicMagics):
    """Bringing your own images."""

    @usage(
        "%load_data images/ --valid 0.2",
        "your image folders as train and val loaders",
    )
    @argument(
        "path",
        metavar="PATH",
        help="a folder of class folders: PATH/<class>/ or PATH/train|val/<class>/",
    )
    @argument(
        "--valid",
        type=float,
        default=None,
        metavar="FRACTION",
        help="the share held out for validation when PATH has no train/ and val/ (default 0.2)",
    )
    @argument("--batch", type=int, default=None, metavar="N", help="images per batch (default 32)")
    @argument(
        "--size",
        type=int,
        default=None,
        metavar="N",
        help="the crop side in pixels (default: the weights' own)",
    )
    @argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="loader processes (default: the machine's cores, at most 8)",
    )
    @argument(
        "--for",
        dest="model",
        default=None,
        metavar="MODEL",
        help="the model whose weights' transforms and class names apply (default: the current one)",
    )
    @argument(
        "--as",
        dest="bind",
        default="train_loader,val_loader",
        metavar="TRAIN,VAL",
        help="the two variables bound (default: train_loader,val_loader)",
    )
    @line_magic
    def load_data(self, line: str) -> None:
        """Bind a training and a validation loader over a folder of class folders
        (torchvision's ImageFolder; without train/ and val/ a seeded split): evaluation
        transforms are the model's weights' own, training adds a random resized crop and
        a flip at the same size and normalisation, and the class folders become the
        model's class names, so `%replace_head auto` needs no count. Shows the images per
        class and split, a strong imbalance and files present in both splits."""
        args = parse(self.load_data, line)
        options: dict[str, Any] = {
            name: getattr(args, name)
            for name in ("valid", "batch", "size", "workers")
            if getattr(args, name) is not None
        }
        with self.refusals(self.load_data):
            names = [name.strip() for name in args.bind.split(",")]
            if len(names) != 2:
                raise TorchMagicError(
                    f"two names, the training and the validation loader's, e.g. "
                    f"train_loader,val_loader; got {args.bind}",
                    param="bind",
                )
            found = self.session.load_data(
                args.path, model=args.model, bind=(names[0], names[1]), **options
            )
        self.show(render.render(found, self.width))
