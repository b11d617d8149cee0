"""The one configurable (``%config TorchMagics.…``, ipython_config.py) that owns the
Session, and loading / unloading every topic's magics with it."""

from __future__ import annotations

import difflib
import re

from IPython.core.interactiveshell import InteractiveShell
from traitlets import Enum, Float, Integer, Unicode, observe
from traitlets.config import Configurable

from ..core import Session, SessionConfig
from ..core.choices import POLICIES
from .base import TopicMagics
from .completion import MagicCompleter
from .completion import register as register_completer
from .completion import unregister as unregister_completer
from .data import DataMagics
from .devices import DeviceMagics
from .evaluation import EvaluationMagics
from .models import ModelMagics
from .session import SessionMagics
from .surgery import SurgeryMagics
from .training import TrainingMagics

# How the notebook's session is named when another session is refused on its models.
OWNER = "the notebook's magics (%load_ext torchmagic)"
# How IPython refuses a line magic it does not know (run_line_magic has no hook for it).
_NOT_FOUND = re.compile(r"Line magic function `%(\S+)` not found\.")

TOPICS: tuple[type[TopicMagics], ...] = (
    SurgeryMagics,
    ModelMagics,
    DataMagics,
    TrainingMagics,
    EvaluationMagics,
    DeviceMagics,
    SessionMagics,
)


class TorchMagics(Configurable):
    """Transfer-learning magics over a live PyTorch model (``%load_ext torchmagic``):
    their settings, and the Session every topic drives."""

    bn_policy = Enum(
        POLICIES,
        default_value="eval",
        help="BatchNorm policy for frozen blocks: eval (stats frozen), train, frozen (swap).",
    ).tag(config=True)
    unfreeze_lr_ratio = Float(
        0.1, help="Default %unfreeze lr as a fraction of the head group's lr."
    ).tag(config=True)
    width = Integer(
        0,
        help="Width of the rendered output in characters; 0: the terminal's width in a "
        "terminal, 100 in a notebook (where wider tables scroll sideways).",
    ).tag(config=True)
    summary_depth = Integer(2, help="Default depth of %summary.").tag(config=True)
    summary_max_rows = Integer(60, help="Rows %summary shows before it collapses.").tag(config=True)
    history_limit = Integer(
        100, min=1, help="Commands %tm undo can revert; the oldest are dropped beyond it."
    ).tag(config=True)
    history_bytes = Integer(
        None,
        allow_none=True,
        min=0,
        help="Bytes the undo history may keep alive (optimizer state and layers set aside); "
        "the oldest commands are dropped beyond it (the last one always stays). None: a "
        "quarter of the machine's RAM, where that state lives, and at least 1 GiB.",
    ).tag(config=True)
    scaler_name = Unicode(
        "scaler", help="User variable that %amp on fp16 binds the session's GradScaler to."
    ).tag(config=True)

    completer: MagicCompleter  # tab completion, while loaded

    def __init__(self, shell: InteractiveShell, **kwargs) -> None:
        # the shell as parent: ipython_config.py's TorchMagics section applies
        super().__init__(parent=shell, **kwargs)
        self.shell = shell
        self.session = Session(
            namespace=shell.user_ns,
            hidden=shell.user_ns_hidden,
            config=self._session_config(),
            owner=OWNER,
        )
        self.topics = [topic(shell, self) for topic in TOPICS]

    @classmethod
    def load(cls, shell: InteractiveShell) -> TorchMagics:
        """Register every topic's magics; listed in ``shell.configurables`` so that
        ``%config TorchMagics.…`` reaches the settings."""
        extension = cls(shell)
        shell.configurables.append(extension)  # type: ignore[arg-type]  # IPython types it narrowly
        for topic in extension.topics:
            shell.register_magics(topic)
        shell.events.register("post_run_cell", extension._after_cell)
        extension.completer = register_completer(shell, extension)
        return extension

    def unload(self) -> None:
        """Remove every magic, hook and configurable that :meth:`load` added."""
        self.shell.events.unregister("post_run_cell", self._after_cell)
        unregister_completer(self.shell, self.completer)
        manager = self.shell.magics_manager
        for topic in self.topics:
            topic.close()
            for table in manager.magics.values():
                for name in [n for n, f in table.items() if getattr(f, "__self__", None) is topic]:
                    del table[name]
            if manager.registry.get(type(topic).__name__) is topic:
                del manager.registry[type(topic).__name__]
        ours = {id(self), *(id(topic) for topic in self.topics)}
        self.shell.configurables[:] = [c for c in self.shell.configurables if id(c) not in ours]

    def _after_cell(self, result=None) -> None:
        """Remember compiled models as first seen, so doctor can tell later edits; let
        go of the undo logs of rebound models; name the magic a misspelt one meant."""
        self._suggest_magic(getattr(result, "error_in_exec", None))
        self.session.workspace.namespace = self.shell.user_ns
        self.session.observe_compiled()
        self.session.prune_history()

    def _suggest_magic(self, error: BaseException | None) -> None:
        """``did you mean %freeze?`` under IPython's "Line magic function `%freez` not
        found" (IPython offers no hook into that refusal; its display stays as it is)."""
        found = _NOT_FOUND.fullmatch(str(error)) if error is not None else None
        if found is None:
            return
        names = list(self.shell.magics_manager.magics["line"])
        close = difflib.get_close_matches(found.group(1), names, n=1)
        if close:
            print(f"%{found.group(1)}: did you mean %{close[0]}?")

    def _session_config(self) -> SessionConfig:
        return SessionConfig(
            bn_policy=self.bn_policy,
            unfreeze_lr_ratio=self.unfreeze_lr_ratio,
            summary_depth=self.summary_depth,
            summary_max_rows=self.summary_max_rows,
            history_limit=self.history_limit,
            history_bytes=self.history_bytes,
        )

    @observe(
        "bn_policy",
        "unfreeze_lr_ratio",
        "summary_depth",
        "summary_max_rows",
        "history_limit",
        "history_bytes",
    )
    def _settings_changed(self, change) -> None:
        if hasattr(self, "session"):
            self.session.config = self._session_config()


def loaded(shell: InteractiveShell) -> TorchMagics | None:
    """The extension loaded in ``shell``, if any."""
    return next((c for c in shell.configurables if isinstance(c, TorchMagics)), None)
