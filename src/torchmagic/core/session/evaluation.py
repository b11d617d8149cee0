"""The Session's evaluation and prediction: the model, loader, loss and device resolved
once, the class names from every source the session knows (see
``core.evaluation.labels``), then one pass of ``core.evaluation``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.utils.data import DataLoader

from ..errors import TorchMagicError
from ..evaluation import labels as class_names
from ..evaluation.evaluate import (
    EvaluateOptions,
    Evaluation,
    EvaluationPlan,
)
from ..evaluation.evaluate import check_options as check_evaluate
from ..evaluation.evaluate import evaluate as run_evaluation
from ..evaluation.predict import Prediction, Predictions, PredictOptions, inputs_of
from ..evaluation.predict import check_options as check_predict
from ..evaluation.predict import predict as run_prediction
from ..evaluation.samples import normalization
from ..evaluation.transforms import eval_transforms
from ..modules import unwrap
from ..training.data import base_dataset
from ..training.fit_plan import resolve_loss
from ..zoo import LoadedModel
from . import names
from .hardware import check_placement

if TYPE_CHECKING:
    from .facade import Session


def _loaded(session: Session, model: nn.Module) -> LoadedModel | None:
    """What ``load_model`` built ``model`` with, if it built it."""
    return next((lm for lm in session.loaded.values() if unwrap(lm.model) is model), None)


def names_for(
    session: Session, model: nn.Module, data: object = None
) -> Callable[[int], tuple[str, ...]]:
    """The class names of ``model`` for a count of classes: given with ``labels=``, else
    its config's ``id2label``, else the loader's dataset's ``classes``, else the
    categories of its weights, else the indices."""
    loaded = _loaded(session, model)
    sources = (
        session.class_names.given(model),
        class_names.config_names(model),
        class_names.dataset_names(data),
        None if loaded is None else loaded.categories,
    )
    return lambda count: class_names.pick(count, *sources)


def known_names(session: Session, model: str | None) -> tuple[str, ...] | None:
    """The (current) model's class names from what the session knows, or None."""
    _, module = session.workspace.resolve_model(model)
    real = unwrap(module)
    loaded = _loaded(session, real)
    return next(
        (
            names
            for names in (
                session.class_names.given(real),
                class_names.config_names(real),
                None if loaded is None else loaded.categories,
            )
            if names is not None
        ),
        None,
    )


def _decoder(loaded: LoadedModel | None) -> Callable[[Any], str] | None:
    """A text model's tokenizer as a function of one sample's inputs, where known."""
    tokenizer = None if loaded is None else loaded.preprocess
    decode = getattr(tokenizer, "decode", None)
    if not callable(decode):
        return None
    return lambda one: str(decode(one["input_ids"], skip_special_tokens=True))


def evaluate(
    session: Session, data: object, model: str | None, options: EvaluateOptions
) -> Evaluation:
    check_evaluate(options)
    workspace = session.workspace
    name, module = workspace.resolve_model(model)
    real = unwrap(module)
    device = check_placement(session, name, real)
    loader = names.loader(workspace, data, "data")
    against = None
    if options.against is not None:
        earlier = names.variable(workspace, options.against, "against")
        if not isinstance(earlier, Evaluation):
            raise TorchMagicError(
                f"against must be an earlier evaluation, got a {type(earlier).__name__}",
                param="against",
            )
        against = earlier
    loaded = _loaded(session, real)
    dataset = base_dataset(getattr(loader, "dataset", None))
    plan = EvaluationPlan(
        model=module,
        model_name=name,
        data=loader,
        data_name=names.name_of(workspace, data, "data"),
        loss_fn=resolve_loss(options.loss, workspace.namespace),
        device=device,
        amp=session.amp,
        options=replace(options, against=None),
        labels=names_for(session, real, loader),
        against=against,
        normalization=normalization(getattr(dataset, "transform", None))
        or normalization(None if loaded is None else loaded.preprocess),
        decode=_decoder(loaded),
    )
    return run_evaluation(plan)


def predict(
    session: Session, value: object, model: str | None, options: PredictOptions
) -> Prediction | Predictions:
    check_predict(options)
    workspace = session.workspace
    name, module = workspace.resolve_model(model)
    real = unwrap(module)
    device = check_placement(session, name, real)
    if isinstance(value, str) and value in workspace.namespace:
        value = workspace.namespace[value]
    sources, one = inputs_of(value)
    given = options.transforms
    if given is not None:
        given = names.variable(workspace, given, "transforms")  # type: ignore[assignment]
    loaded = _loaded(session, real)
    built = session.pipelines.get(real)  # load_data's, at the size it was told
    loaders = [(n, v) for n, v in workspace.items() if isinstance(v, DataLoader)]
    transform = eval_transforms(
        given,  # type: ignore[arg-type]
        built.eval if built is not None else None if loaded is None else loaded.preprocess,
        loaders,
    )
    found = run_prediction(
        module,
        name,
        sources,
        transform,
        device,
        amp=session.amp,
        labels=names_for(session, real),
        top=options.top,
    )
    return found[0] if one else found
