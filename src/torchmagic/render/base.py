"""The drawing surface shared by every renderable: a MIME bundle with ``text/plain`` and
``text/html``, from a console created per render (never at import, never forced to be a
terminal), and number formatting."""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.console import Console, RenderableType
from rich.table import Table

_HTML = (
    '<pre style="white-space:pre;overflow-x:auto;line-height:normal;'
    "font-family:Menlo,'DejaVu Sans Mono',consolas,'Courier New',monospace\">"
    "<code>{code}</code></pre>"
)


class Rendered:
    """A renderable with its own MIME bundle; ``display()`` it, or ``str()`` it."""

    def __init__(self, renderable: RenderableType, width: int = 100) -> None:
        self.renderable = renderable
        self.width = width

    def _console(self) -> Console:
        # markup off: module names, commands and usage strings contain [brackets];
        # force_jupyter off: in a kernel rich would otherwise display its own copy
        return Console(
            record=True,
            force_jupyter=False,
            width=self.width,
            file=io.StringIO(),
            color_system="truecolor",
            markup=False,
            highlight=False,
            emoji=False,
        )

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        console = self._console()
        console.print(self.renderable)
        text = console.export_text(clear=False)
        html = console.export_html(inline_styles=True, code_format=_HTML)
        return {"text/plain": text.rstrip("\n"), "text/html": html}

    def __str__(self) -> str:
        console = self._console()
        console.print(self.renderable)
        return console.export_text().rstrip("\n")


def human(n: float) -> str:
    """12_345_678 → '12.3M'."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return str(int(n))


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def table(title: str | None, columns: Sequence[tuple[str, str]] = (), **options) -> Table:
    """The house table: bold left title, no outer edge; ``columns`` as (name, justify)."""
    drawn = Table(
        title=title,
        title_justify="left",
        title_style="bold",
        show_edge=False,
        pad_edge=False,
        **options,
    )
    for name, justify in columns:
        drawn.add_column(name, justify=justify, overflow="fold")
    return drawn
