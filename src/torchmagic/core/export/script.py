"""The session's commands as a short Python script of Session calls.

Each command is spelled from its :class:`Replay` (targets relative to the model, numbers
by ``repr`` so every lr comes back exact), ``fit`` runs with their arguments in between.
The script is a batch job's skeleton: its header says how to launch it (one process,
torchrun), a marked place names the variables it expects; built there the way the notebook
first built them, it makes the same structure: flags, groups, lrs, heads, adapters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..surgery.results import Replay
from .files import replaced_atomically

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


def write(text: str, path: str) -> None:
    """``text`` into ``path`` (checked by ``files.destination``), atomically: ``path`` is
    never a part of the script (Ctrl-C, a full disk). Mode as ``open`` gives it (the
    umask)."""
    with replaced_atomically(path) as temporary, open(temporary, "x", encoding="utf-8") as out:
        out.write(text)
