"""Training libraries' own objects out of step with the model or optimizer they hold: a
transformers Trainer whose checkpoint no longer resumes, a fastai Learner whose own
optimizer misses parameters that train. Each library's integration says what is wrong."""

from __future__ import annotations

from collections.abc import Iterator

from ...integrations.lookup import integration_of
from ..context import DoctorContext
from ..findings import Finding
from ..registry import CheckGroup

checks = CheckGroup()


@checks.namespace
def library_objects(context: DoctorContext) -> Iterator[Finding]:
    """Each object reached from the namespace whose integration knows how it gets out of step."""
    for found in context.ws.found():
        known = integration_of(found.value)
        check = getattr(known, "out_of_step", None)
        wrong = check(found.path, found.value) if check is not None else None
        if wrong is not None:
            yield Finding("library-out-of-step", "error", found.path, *wrong)
