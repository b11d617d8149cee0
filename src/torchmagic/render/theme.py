"""The palette: semantic roles (error, warning, ok…) mapped to the front end's own theme.

Renderers colour text by role (``theme.style("ok")``), never by a fixed colour. In a
terminal a role is an ANSI colour, so it follows the terminal's palette. In HTML it is a
CSS colour that follows the notebook's theme: JupyterLab's ``--jp-*`` variable, else VS
Code's ``--vscode-*`` variable, else a fixed fallback for front ends with neither.

Some themes' own state colours are too faint to read as text on their background
(JupyterLab light's ``--jp-warn-color1`` is 2.9:1 on white, VS Code Light Modern's
``errorForeground`` 3.4:1). Such roles mix the theme colour with the surrounding text
colour, which moves it towards the foreground in light and dark themes alike: ``mix`` is
the share of the theme colour kept. The text colour is VS Code's editor foreground where
it is defined (an output's own text there is a grey, ``#616161`` in the light themes,
that leaves a mix of it under 4.5:1), else the output's (``currentColor``).
tests/render/test_theme.py checks every role against the known defaults of each theme.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.style import Style

_TEXT = "var(--vscode-editor-foreground, currentColor)"  # the colour a role is mixed with


@dataclass(frozen=True)
class Role:
    """One semantic colour, in the terminal and in each notebook front end."""

    name: str
    terminal: str  # a rich style: an ANSI colour name, or "dim"; unique per role
    jupyter: str  # JupyterLab CSS variable
    vscode: str  # VS Code CSS variable (its webviews define every theme colour)
    fallback: str  # fixed hex for front ends with neither: >= 3:1 on white, #111, #1f1f1f
    mix: int = 100  # percent of the theme colour kept when mixed with the text colour
    text: bool = True  # text reads at 4.5:1; a graphic (bar) needs 3:1

    @property
    def chain(self) -> str:
        """The theme colour: JupyterLab's, else VS Code's, else the fixed fallback."""
        return f"var({self.jupyter}, var({self.vscode}, {self.fallback}))"

    @property
    def css(self) -> str:
        if self.mix == 100:
            return self.chain
        return f"color-mix(in srgb, {self.chain} {self.mix}%, {_TEXT})"


ROLES: dict[str, Role] = {
    role.name: role
    for role in (
        Role("error", "red", "--jp-error-color1", "--vscode-errorForeground", "#e0403a", 75),
        Role(
            "warning",
            "yellow",
            "--jp-warn-color1",
            "--vscode-editorWarning-foreground",
            "#b87400",
            65,
        ),
        Role("ok", "green", "--jp-success-color1", "--vscode-charts-green", "#2e9a3e", 85),
        Role("info", "cyan", "--jp-info-color1", "--vscode-editorInfo-foreground", "#0891b2", 80),
        # frozen beside "ok" (trainable): blue against green, told apart with every
        # common colour-vision deficiency (teal against green was not)
        Role("frozen", "blue", "--jp-brand-color1", "--vscode-charts-blue", "#3b82f6", 75),
        Role(
            "accent",
            "bright_blue",
            "--jp-content-link-color",
            "--vscode-textLink-foreground",
            "#3b82f6",
            85,
        ),
        Role(
            "dim",
            "dim",
            "--jp-content-font-color2",
            "--vscode-descriptionForeground",
            "#808080",
            90,
        ),
        # the editor themes' purple: BatchNorm lines
        Role(
            "bn",
            "magenta",
            "--jp-mirror-editor-operator-color",
            "--vscode-charts-purple",
            "#b05cc8",
            90,
        ),
        Role(
            "bar_done",
            "bright_cyan",
            "--jp-brand-color1",
            "--vscode-progressBar-background",
            "#3b82f6",
            text=False,
        ),
        Role(
            "bar_todo",
            "bright_black",
            "--jp-layout-color4",
            "--vscode-editorLineNumber-foreground",
            "#808080",
            text=False,
        ),
    )
}

# the role a rich colour name stands for, for the HTML export
_BY_COLOR = {
    color.name: role
    for role in ROLES.values()
    if (color := Style.parse(role.terminal).color) is not None
}


def style(role: str, *, bold: bool = False) -> Style:
    """The rich style of a role (a KeyError names a role that does not exist)."""
    drawn = Style.parse(ROLES[role].terminal)
    return drawn + Style(bold=True) if bold else drawn


def css(style: Style) -> str:
    """Inline CSS for a rich style: roles become theme-following colours."""
    rules = []
    if style.color is not None:
        role = _BY_COLOR.get(style.color.name)
        color = role.css if role else style.color.get_truecolor().hex
        rules.append(f"color:{color}")
    elif style.dim:
        rules.append(f"color:{ROLES['dim'].css}")
    if style.bold:
        rules.append("font-weight:bold")
    if style.italic:
        rules.append("font-style:italic")
    if style.underline:
        rules.append("text-decoration:underline")
    return ";".join(rules)
