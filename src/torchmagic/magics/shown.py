"""A result a magic has displayed itself, and returns as well.

``%fit``, ``%lr_find`` and ``%fine_tune`` show their result where the live progress was,
wherever the magic sits in the cell, and return it (``history = %fit …``). IPython also
displays a cell's last value: shown that way, the same result would appear twice. So
the returned value shows once per cell: asked again in the cell that ran the magic (the
cell's last line, or ``display()``), it draws nothing; in a later cell (``history`` on
its own line) it shows as the result does. Attributes read through to the result
(``history.epochs``, ``found.suggestion``). In terminal IPython a bare ``%fit …`` ending a
cell returns None instead: the prompt would echo an empty ``Out[n]:`` under the result.
"""

from __future__ import annotations

import ast
import weakref
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display

if TYPE_CHECKING:
    from ..render import Rendered


class ShownResult:
    """``view`` (already displayed in the cell running now) as the magic's return value."""

    def __init__(self, view: Rendered, shell: InteractiveShell) -> None:
        self.view = view
        self._shell = shell
        cell = shell.displayhook.exec_result  # the ExecutionResult of the cell running now
        self._cell = None if cell is None else weakref.ref(cell)

    def _in_its_cell(self) -> bool:
        cell = self._cell() if self._cell is not None else None
        return cell is not None and cell is self._shell.displayhook.exec_result

    def _ipython_display_(self) -> None:
        if not self._in_its_cell():
            display(self.view)

    def _repr_mimebundle_(
        self, include: Collection[str] | None = None, exclude: Collection[str] | None = None
    ) -> dict[str, str]:
        """The view's bundle, for callers outside IPython's display (IPython itself calls
        ``_ipython_display_``)."""
        return self.view._repr_mimebundle_(include, exclude)

    def __str__(self) -> str:
        return str(self.view)

    def __repr__(self) -> str:
        return f"<{type(self.view).__name__}: {str(self.view).partition(chr(10))[0]}>"

    def __getattr__(self, name: str) -> Any:
        view = self.__dict__.get("view")
        if name.startswith("_") or view is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(view, name)


def echoed_in_a_terminal(shell: InteractiveShell, magic: str) -> bool:
    """Whether IPython's terminal would print an empty ``Out[n]:`` for ``%magic``'s value:
    the shell has a text prompt (not a kernel, which sends nothing for an empty
    display) and the cell running now ends in ``%magic …`` as a bare expression, whose
    value the prompt echoes. Its result is on the screen already; returning None there
    leaves the prompt out (``history = %fit …`` still gets the value)."""
    from IPython.terminal.interactiveshell import TerminalInteractiveShell

    cell = shell.displayhook.exec_result
    if not isinstance(shell, TerminalInteractiveShell) or cell is None or not cell.info:
        return False
    try:
        body = ast.parse(shell.transform_cell(cell.info.raw_cell or "")).body
    except SyntaxError:
        return False
    last = body[-1] if body else None
    if not isinstance(last, ast.Expr) or not isinstance(last.value, ast.Call):
        return False
    call = last.value
    return (
        isinstance(call.func, ast.Attribute)
        and call.func.attr == "run_line_magic"
        and bool(call.args)
        and isinstance(call.args[0], ast.Constant)
        and call.args[0].value == magic
    )
