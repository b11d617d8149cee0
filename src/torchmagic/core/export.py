"""The session's commands as a short Python script of Session calls.

Each command is spelled from its :class:`Replay` (targets relative to the model, numbers
by ``repr`` so every lr comes back exact), ``fit`` runs with their arguments in between.
The header names the variables the script expects; run with them bound (built the way
the notebook first built them) it makes the same structure: flags, groups, lrs, heads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import TorchMagicError
from .surgery.results import Replay


@dataclass(frozen=True)
class ExportReport:
    path: str
    variables: tuple[tuple[str, str], ...]  # (name, what it is) the script expects
    commands: int  # Session calls written (fits included)


def _value(value: object) -> str:
    if isinstance(value, tuple) and value and all(isinstance(v, tuple) for v in value):
        return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in value) + "}"  # set_base_lrs
    return repr(value)


def python_call(replay: Replay, names: dict[str, str] | None = None) -> str:
    """``tm.freeze("layer1-3", bn="eval")``. Targets are relative to the session's model
    (``""`` is the model itself); ``names``: options whose value is a variable, written bare
    (``tm.fit(train_loader, ...)``)."""
    names = names or {}
    words: list[str] = []
    if replay.method == "replace_head":
        words.append(repr(replay.targets[0] if replay.targets and replay.targets[0] else "auto"))
    elif replay.method in ("freeze", "unfreeze"):
        words += [repr(t or "model") for t in replay.targets]
    for key, value in replay.options:
        if key in names:
            word = names[key]
        else:
            word = _value(list(value) if isinstance(value, tuple) and key == "exclude" else value)
        if key in ("num_classes", "lrs", "train"):
            words.append(word)
        else:
            words.append(f"{key}={word}")
    return f"tm.{replay.method}({', '.join(words)})"


def script(
    variables: Sequence[tuple[str, str]],
    session_line: str,
    calls: Sequence[tuple[str, str]],
    version: str,
    model_name: str,
) -> str:
    """The script: header, the Session, then each (call, command it came from)."""
    width = max((len(n) for n, _ in variables), default=0)
    expects = "\n".join(f"    {name.ljust(width)}  {what}" for name, what in variables)
    lines = [
        f'"""Session commands on `{model_name}`, exported by torchmagic {version}.',
        "",
        "Run it where these variables exist, built the way the notebook first built them:",
        expects,
        '"""',
        "",
        "import torchmagic",
        "",
        session_line,
    ]
    for call, command in calls:
        lines.append(call if not command or command == call else f"{call}  # {command}")
    return "\n".join(lines) + "\n"


def write(text: str, path: str | os.PathLike) -> None:
    path = os.path.expanduser(os.fspath(path))
    if not path.endswith(".py"):
        raise TorchMagicError(
            f"export writes a Python script: '{path}' must end in .py", param="path"
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise TorchMagicError(f"cannot export to '{path}': no folder '{folder}'", param="path")
    with open(path, "w", encoding="utf-8") as stream:
        stream.write(text)
