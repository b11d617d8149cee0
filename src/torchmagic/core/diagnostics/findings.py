"""What the doctor reports: one finding per problem, and the wording findings share."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..advice import Advice, Advised, Call

# Most severe first: the report's order.
SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding(Advised):
    check: str
    severity: str  # "error" (wrong results or a crash), "warning" (waste), "info"
    subject: str
    message: str
    advice: str | Advice  # the fix: text, with the commands in it as Calls
    nbytes: int = 0  # memory the problem holds, when known


def first_names(names: list[str], shown: int = 3) -> str:
    """``a, b, c and 4 more``: a finding's subject stays one line."""
    if len(names) <= shown:
        return ", ".join(names)
    return ", ".join(names[:shown]) + f" and {len(names) - shown} more"


def block_call(method: str, model_name: str, param_names: Iterable[str], **options: str) -> Call:
    """A freeze / unfreeze of the top-level blocks covering these parameters
    (``model.layer1``, ``model.fc``), the first four named."""
    tops = list(dict.fromkeys(n.split(".")[0] for n in param_names))
    targets = tuple(f"{model_name}.{t}" for t in tops[:4])
    return Call(method, targets, tuple(options.items()), more=len(tops) > 4)
