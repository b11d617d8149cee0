"""The session's commands as a short Python script of Session calls.

Each command is spelled from its :class:`Replay` (targets relative to the model, numbers
by ``repr`` so every lr comes back exact), ``fit`` runs with their arguments in between.
The script is a batch job's skeleton: its header says how to launch it (one process,
torchrun), a marked place names the variables it expects; built there the way the notebook
first built them, it makes the same structure: flags, groups, lrs, heads, adapters.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import TorchMagicError
from .surgery.results import Replay

BUILD_START = "---- build here: your model, optimizer, schedulers and data ----"
BUILD_END = "---- end of your constructors ----"


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
    elif replay.method in ("freeze", "unfreeze", "lora"):
        words += [repr(t or "model") for t in replay.targets]
    for key, value in replay.options:
        if key in names:
            word = names[key]
        else:
            word = _value(list(value) if isinstance(value, tuple) and key == "exclude" else value)
        if key in ("num_classes", "lrs", "train", "mode"):
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
    """The script, a batch job's skeleton: header (how to launch it), imports, the marked
    place for the user's constructors, the Session, then each (call, command it came from)."""
    width = max((len(n) for n, _ in variables), default=0)
    names = [name for name, _ in variables]
    lines = [
        f'"""Session commands on `{model_name}`, exported by torchmagic {version}.',
        "",
        "A batch job's skeleton: build the variables below in the marked place, the way the",
        "notebook first built them, then run it",
        "",
        "    python run.py                         # one process (over SSH: under tmux or nohup)",
        "    nohup python run.py > run.log 2>&1 &  # ... and it goes on after you log out",
        "    torchrun --nproc_per_node=2 run.py    # one process per GPU: in the marked place,",
        '                                          # init_process_group("nccl") and the model',
        "                                          # on cuda:LOCAL_RANK (see torchmagic's README)",
        '"""',
        "",
        "import torch  # noqa: F401  (for your constructors)",
        "",
        "import torchmagic",
        "",
        f"# {BUILD_START}",
        *(f"{name.ljust(width)} = ...  # {what}" for name, what in variables),
        f"# {BUILD_END}",
        f"if any(value is ... for value in ({', '.join(names)},)):",
        '    raise SystemExit("build the model, optimizer and data in the marked place first")',
        "",
        session_line,
    ]
    for call, command in calls:
        lines.append(call if not command or command == call else f"{call}  # {command}")
    return "\n".join(lines) + "\n"


def write(text: str, path: str | os.PathLike, force: bool = False) -> None:
    """``text`` into a temporary file beside ``path``, renamed over it: ``path`` is never
    a part of the script (Ctrl-C, a full disk). Mode as ``open`` gives it (the umask); an
    existing file is replaced only with ``force``. Every refusal is one line, and leaves
    neither a temporary nor an empty file."""
    path = os.path.expanduser(os.fspath(path))
    where = f"cannot export to '{path}'"
    if not path.endswith(".py"):
        raise TorchMagicError(
            f"export writes a Python script: '{path}' must end in .py", param="path"
        )
    if os.path.isdir(path):
        raise TorchMagicError(f"{where}: it is a folder", param="path")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise TorchMagicError(f"{where}: no folder '{folder}'", param="path")
    if os.path.lexists(path) and not force:
        raise TorchMagicError(f"{where}: the file exists; force=True replaces it", param="force")
    temporary = os.path.join(folder, f".tm-export-{os.getpid()}-{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary, "x", encoding="utf-8") as stream:  # umask-honouring mode
            stream.write(text)
        os.replace(temporary, os.path.realpath(path))
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if not isinstance(exc, OSError):
            raise
        kept = "the old file is kept" if os.path.exists(path) else "nothing was written"
        raise TorchMagicError(f"{where}: {exc.strerror or exc}; {kept}", param="path") from None
