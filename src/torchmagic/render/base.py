"""The drawing surface shared by every renderable: a MIME bundle with ``text/plain`` and
``text/html``, from a console created per render (never at import, never forced to be a
terminal), and number formatting."""

from __future__ import annotations

import io
from collections.abc import Collection, Sequence
from typing import Any

from rich.console import Console, JustifyMethod, RenderableType
from rich.table import Table

_HTML = (
    '<pre style="white-space:pre;overflow-x:auto;line-height:normal;'
    "font-family:Menlo,'DejaVu Sans Mono',consolas,'Courier New',monospace\">"
    "<code>{code}</code></pre>"
)


DEFAULT_WIDTH = 100
MIME_TYPES = ("text/plain", "text/html")


def wanted(include: Collection[str] | None, exclude: Collection[str] | None) -> list[str]:
    """The MIME types of ours a frontend asked for (IPython: empty ``include`` means all)."""
    return [m for m in MIME_TYPES if (not include or m in include) and m not in (exclude or ())]


class Rendered:
    """A renderable with its own MIME bundle; ``display()`` it, or ``str()`` it."""

    def __init__(self, renderable: RenderableType, width: int | None = None) -> None:
        self.renderable = renderable
        self.width = width or DEFAULT_WIDTH

    def _console(self) -> Console:
        # markup off: module names, commands and usage strings contain [brackets];
        # force_jupyter off: in a kernel rich would otherwise display its own copy
        console = Console(
            record=True,
            force_jupyter=False,
            width=self.width,
            file=io.StringIO(),
            color_system="truecolor",
            markup=False,
            highlight=False,
            emoji=False,
        )
        console.print(self.renderable)
        return console

    def _repr_mimebundle_(
        self, include: Collection[str] | None = None, exclude: Collection[str] | None = None
    ) -> dict[str, str]:
        types = wanted(include, exclude)
        if not types:
            return {}
        console = self._console()
        bundle = {}
        if "text/plain" in types:
            bundle["text/plain"] = _plain(console.export_text(clear=False))
        if "text/html" in types:
            bundle["text/html"] = console.export_html(inline_styles=True, code_format=_HTML)
        return bundle

    def __str__(self) -> str:
        return _plain(self._console().export_text())


def _plain(text: str) -> str:
    """Table cells pad with spaces: no line ends in one, and no blank tail."""
    return "\n".join(line.rstrip() for line in text.rstrip("\n").split("\n"))


def human(n: float) -> str:
    """12_345_678 → '12.3M'."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return str(int(n))


def lr(value: float) -> str:
    """Learning rates as people type them: 0.0001 → '1e-4', 2.45e-06 → '2.45e-6',
    0.01 → '0.01'."""
    if value and abs(value) < 1e-3:
        mantissa, exponent = f"{value:.2e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return f"{value:.3g}"


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def table(
    title: str | None, columns: Sequence[tuple[str, JustifyMethod]] = (), **options: Any
) -> Table:
    """The house table: bold left title, no outer edge; ``columns`` as (name, justify).
    A table is at least as wide as its title, so the title never wraps while it fits."""
    drawn = Table(
        title=title,
        min_width=len(title) if title else None,
        title_justify="left",
        title_style="bold",
        show_edge=False,
        pad_edge=False,
        **options,
    )
    for name, justify in columns:
        drawn.add_column(name, justify=justify, overflow="fold")
    return drawn
