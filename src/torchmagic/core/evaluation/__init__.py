"""After training: measuring a classifier on a loader (:mod:`.evaluate`), comparing two
measurements of the same samples (:mod:`.compare`), predicting new inputs with the
evaluation transforms (:mod:`.predict`, :mod:`.transforms`), and the class names a model's
outputs mean (:mod:`.labels`). Every pass leaves the model and the random state as they
were (:mod:`.running`)."""

from .compare import Comparison
from .evaluate import ClassRow, EvaluateOptions, Evaluation
from .predict import Prediction, Predictions, PredictOptions
from .samples import WorstSample

__all__ = [
    "ClassRow",
    "Comparison",
    "EvaluateOptions",
    "Evaluation",
    "PredictOptions",
    "Prediction",
    "Predictions",
    "WorstSample",
]
