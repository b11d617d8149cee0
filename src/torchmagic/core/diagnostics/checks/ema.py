"""EMA copies: averaged models that no longer match the model they average."""

from __future__ import annotations

from collections.abc import Iterator

from ...ema_owners import parameter_shapes
from ...modules import unwrap
from ..context import DoctorContext
from ..findings import Finding
from ..registry import CheckGroup

checks = CheckGroup()


def _shape(shape: tuple[int, ...] | None) -> str:
    return "missing" if shape is None else "×".join(map(str, shape)) or "a scalar"


@checks.namespace
def ema_copies(context: DoctorContext) -> Iterator[Finding]:
    """An EMA copy whose structure no longer matches the model it averages (the model
    sharing most of its parameter names): its next update crashes on a shape, or blends a
    fresh head into a trained one."""
    for path, copy in context.ws.ema_helpers():
        shapes = parameter_shapes(unwrap(copy))
        scored = []
        for model in context.models:
            theirs = parameter_shapes(model.module)
            scored.append((len(shapes.keys() & theirs.keys()), model.name, theirs))
        if not scored:
            continue
        shared, name, theirs = max(scored, key=lambda item: item[0])
        if shared * 2 < len(shapes) or theirs == shapes:
            continue
        names = [*theirs, *(k for k in shapes if k not in theirs)]  # the model's order
        differ = [k for k in names if shapes.get(k) != theirs.get(k)]
        first = differ[0]
        yield Finding(
            "ema-mismatch",
            "error",
            path,
            f"the EMA copy `{path}` no longer matches `{name}`: {first} is "
            f"{_shape(theirs.get(first))} in {name} but {_shape(shapes.get(first))} in the copy "
            f"({len(differ)} parameter(s) differ); its next update fails or averages the wrong "
            "tensors",
            f"re-create it from {name} (e.g. {path} = AveragedModel({name})); "
            "torchmagic's head replacements keep EMA copies in step from then on",
        )
