"""``%evaluate`` and ``%predict``: measuring the model on a loader and predicting new
inputs, after training."""

from __future__ import annotations

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, real_name

from ..core import EvaluateOptions, Evaluation, PredictOptions, TorchMagicError
from .base import TopicMagics, parse, render
from .shown import ShownResult, echoed_in_a_terminal
from .usage import usage


@magics_class
class EvaluationMagics(TopicMagics):
    """What the trained model does: its metrics and mistakes on a loader, and its
    predictions for new inputs."""

    @usage(
        "%evaluate model val_loader --worst 16",
        "metrics, confusion, worst samples; compare",
    )
    @argument(
        "names",
        nargs="+",
        metavar="[MODEL] LOADER",
        help="the model variable (default: the current model) and the loader to measure on",
    )
    @argument(
        "--worst",
        type=int,
        default=0,
        metavar="N",
        help="show the N samples with the largest loss (their pictures in a notebook)",
    )
    @argument("--top", type=int, default=None, metavar="K", help="also the top-K accuracy")
    @argument(
        "--loss",
        default="cross_entropy",
        metavar="NAME",
        help="cross_entropy, nll, …, or a loss variable, as %%fit names losses",
    )
    @argument("--as", dest="bind", default=None, metavar="VAR", help="bind the Evaluation to VAR")
    @argument(
        "--against",
        default=None,
        metavar="EV",
        help="an earlier Evaluation of the same loader: the change, samples fixed and "
        "broken, McNemar's exact test",
    )
    @line_magic
    def evaluate(self, line: str):
        """Measure the model on a loader in eval mode under inference_mode, with the
        session's device and AMP policy: accuracy, loss, per-class precision / recall /
        f1, the confusion matrix, the most confused pairs; the model, its modes and every
        random state are left exactly as they were."""
        args = parse(self.evaluate, line)
        with self.refusals(self.evaluate):
            model, data = self._model_and_input(args.names, "loader")
            if args.bind is not None and not args.bind.isidentifier():
                raise TorchMagicError(f"'{args.bind}' is not a variable name", param="bind")
            options = EvaluateOptions(
                worst=args.worst, top=args.top, loss=args.loss, against=self._earlier(args.against)
            )
            result = self.session.evaluate(data, model, options)
        if args.bind is not None:
            self.shell.user_ns[args.bind] = result
        return self._shown(self.evaluate, render.render(result, self.width))

    @usage("%predict model photos/ --top 3", "classes of new inputs, eval transforms")
    @argument(
        "names",
        nargs="+",
        metavar="[MODEL] INPUT",
        help="the model variable (default: the current model) and an image path, a folder "
        "of images, or a variable holding a PIL image or a tensor",
    )
    @argument("--top", type=int, default=5, metavar="K", help="the K best classes (default 5)")
    @argument(
        "--transforms",
        default=None,
        metavar="VAR",
        help="the evaluation transforms to use (default: the weights' or a non-augmenting "
        "loader's)",
    )
    @line_magic
    def predict(self, line: str):
        """The model's classes for new inputs, best first with their probabilities,
        through the model's evaluation transforms, never the training augmentation."""
        args = parse(self.predict, line)
        with self.refusals(self.predict):
            model, value = self._model_and_input(args.names, "input")
            options = PredictOptions(top=args.top, transforms=args.transforms)
            result = self.session.predict(value, model, options)
        return self._shown(self.predict, render.render(result, self.width))

    def _model_and_input(self, words: list[str], what: str) -> tuple[str | None, str]:
        """``[MODEL] X``: the model variable (None: the current model), and X."""
        if len(words) > 2:
            raise TorchMagicError(
                f"one model and one {what}, got {len(words)} words: {' '.join(words)}",
                param="names",
            )
        return (words[0], words[1]) if len(words) == 2 else (None, words[0])

    def _earlier(self, name: str | None) -> Evaluation | None:
        """The Evaluation a variable holds (also the value ``ev = %evaluate …`` bound)."""
        if name is None:
            return None
        if name not in self.shell.user_ns:
            raise TorchMagicError(f"against={name}: no variable of that name", param="against")
        value = self.shell.user_ns[name]
        held = getattr(getattr(value, "view", None), "result", value)
        if not isinstance(held, Evaluation):
            raise TorchMagicError(
                f"against={name} is a {type(held).__name__}, not an earlier evaluation",
                param="against",
            )
        return held

    def _shown(self, magic, view: render.Rendered) -> ShownResult | None:
        """Shown now, and returned to be bound (``ev = %evaluate …``), drawn once a cell."""
        self.show(view)
        if echoed_in_a_terminal(self.shell, real_name(magic)):
            return None
        return ShownResult(view, self.shell)
