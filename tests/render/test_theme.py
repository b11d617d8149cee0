"""Colour contrast of everything the renderers emit, in each notebook theme.

No browser runs here, so the CSS is evaluated by hand: ``var()`` chains against the known
default values of the theme variables (JupyterLab 4's theme-light/theme-dark
variables.css; VS Code's Light/Dark Modern themes and its registered defaults, which
Light+/Dark+ use), ``color-mix(in srgb, …, currentColor)`` with the theme's text colour,
and WCAG 2 contrast of the result composited on the theme's output background.
"""

from __future__ import annotations

import re

import pytest

from torchmagic.render import theme
from torchmagic.render.theme import ROLES

Rgba = tuple[float, float, float, float]

_MD = {  # Material Design colours the JupyterLab themes name
    "red-500": "#f44336",
    "red-700": "#d32f2f",
    "orange-500": "#ff9800",
    "orange-700": "#f57c00",
    "green-500": "#4caf50",
    "green-700": "#388e3c",
    "cyan-500": "#00bcd4",
    "cyan-700": "#0097a7",
    "blue-300": "#64b5f6",
    "blue-500": "#2196f3",
    "blue-700": "#1976d2",
    "grey-600": "#757575",
}

THEMES: dict[str, dict[str, str]] = {
    "JupyterLab light": {
        "background": "#ffffff",
        "text": "rgba(0, 0, 0, 0.87)",  # --jp-content-font-color1
        "--jp-error-color1": _MD["red-700"],
        "--jp-warn-color1": _MD["orange-700"],
        "--jp-success-color1": _MD["green-700"],
        "--jp-info-color1": _MD["cyan-700"],
        "--jp-content-link-color": _MD["blue-700"],
        "--jp-content-font-color2": "rgba(0, 0, 0, 0.54)",
        "--jp-mirror-editor-operator-color": "#aa22ff",
        "--jp-brand-color1": _MD["blue-700"],
        "--jp-layout-color4": _MD["grey-600"],
    },
    "JupyterLab dark": {
        "background": "#111111",
        "text": "rgba(255, 255, 255, 1)",
        "--jp-error-color1": _MD["red-500"],
        "--jp-warn-color1": _MD["orange-500"],
        "--jp-success-color1": _MD["green-500"],
        "--jp-info-color1": _MD["cyan-500"],
        "--jp-content-link-color": _MD["blue-300"],
        "--jp-content-font-color2": "rgba(255, 255, 255, 0.7)",
        "--jp-mirror-editor-operator-color": "#d48fff",
        "--jp-brand-color1": _MD["blue-500"],
        "--jp-layout-color4": _MD["grey-600"],
    },
    "VS Code Light Modern": {
        "background": "#ffffff",
        "text": "#616161",  # an output's text: the workbench foreground
        "--vscode-editor-foreground": "#3b3b3b",
        "--vscode-errorForeground": "#f85149",
        "--vscode-editorWarning-foreground": "#bf8803",
        "--vscode-charts-green": "#388a34",
        "--vscode-editorInfo-foreground": "#1a85ff",
        "--vscode-charts-blue": "#1a85ff",
        "--vscode-textLink-foreground": "#005fb8",
        "--vscode-descriptionForeground": "#3b3b3b",
        "--vscode-charts-purple": "#652d90",
        "--vscode-progressBar-background": "#005fb8",
        "--vscode-editorLineNumber-foreground": "#6e7681",
    },
    "VS Code Dark Modern": {
        "background": "#1f1f1f",
        "text": "#cccccc",
        "--vscode-editor-foreground": "#cccccc",
        "--vscode-errorForeground": "#f85149",
        "--vscode-editorWarning-foreground": "#cca700",
        "--vscode-charts-green": "#89d185",
        "--vscode-editorInfo-foreground": "#3794ff",
        "--vscode-charts-blue": "#3794ff",
        "--vscode-textLink-foreground": "#40a6ff",
        "--vscode-descriptionForeground": "#9d9d9d",
        "--vscode-charts-purple": "#b180d7",
        "--vscode-progressBar-background": "#0078d4",
        "--vscode-editorLineNumber-foreground": "#6e7681",
    },
    "VS Code Light+": {
        "background": "#ffffff",
        "text": "#616161",
        "--vscode-editor-foreground": "#000000",
        "--vscode-errorForeground": "#a1260d",
        "--vscode-editorWarning-foreground": "#bf8803",
        "--vscode-charts-green": "#388a34",
        "--vscode-editorInfo-foreground": "#1a85ff",
        "--vscode-charts-blue": "#1a85ff",
        "--vscode-textLink-foreground": "#006ab1",
        "--vscode-descriptionForeground": "#717171",
        "--vscode-charts-purple": "#652d90",
        "--vscode-progressBar-background": "#0e70c0",
        "--vscode-editorLineNumber-foreground": "#237893",
    },
    "VS Code Dark+": {
        "background": "#1e1e1e",
        "text": "#cccccc",
        "--vscode-editor-foreground": "#d4d4d4",
        "--vscode-errorForeground": "#f48771",
        "--vscode-editorWarning-foreground": "#cca700",
        "--vscode-charts-green": "#89d185",
        "--vscode-editorInfo-foreground": "#3794ff",
        "--vscode-charts-blue": "#3794ff",
        "--vscode-textLink-foreground": "#3794ff",
        "--vscode-descriptionForeground": "rgba(204, 204, 204, 0.7)",
        "--vscode-charts-purple": "#b180d7",
        "--vscode-progressBar-background": "#0e70c0",
        "--vscode-editorLineNumber-foreground": "#858585",
    },
    # classic Notebook, nbviewer, GitHub: no theme variables, black on white
    "no theme variables": {"background": "#ffffff", "text": "#000000"},
}
FIXED_BACKGROUNDS = ("#ffffff", "#111111", "#1f1f1f")


# -- colour arithmetic -------------------------------------------------------------------


def parse_color(text: str) -> Rgba:
    text = text.strip()
    if text.startswith("#"):
        digits = text[1:]
        if len(digits) == 3:
            digits = "".join(c * 2 for c in digits)
        r, g, b = (int(digits[i : i + 2], 16) for i in (0, 2, 4))
        return float(r), float(g), float(b), 1.0
    match = re.fullmatch(r"rgba?\(([^)]*)\)", text)
    assert match, f"unparsed colour {text!r}"
    parts = [float(p) for p in match.group(1).split(",")]
    return parts[0], parts[1], parts[2], parts[3] if len(parts) == 4 else 1.0


def mix(first: Rgba, second: Rgba, percent: float) -> Rgba:
    """CSS color-mix in srgb: premultiplied by alpha."""
    p, q = percent / 100, 1 - percent / 100
    alpha = first[3] * p + second[3] * q
    rgb = [(first[i] * first[3] * p + second[i] * second[3] * q) / alpha for i in range(3)]
    return rgb[0], rgb[1], rgb[2], alpha


def over(color: Rgba, background: Rgba) -> Rgba:
    a = color[3]
    r, g, b = (color[i] * a + background[i] * (1 - a) for i in range(3))
    return r, g, b, 1.0


def luminance(color: Rgba) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in color[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(color: Rgba, background: Rgba) -> float:
    fg = luminance(over(color, background))
    bg = luminance(background)
    light, dark = max(fg, bg), min(fg, bg)
    return (light + 0.05) / (dark + 0.05)


# -- CSS evaluation ----------------------------------------------------------------------


def _split_args(text: str) -> list[str]:
    depth, start, parts = 0, 0, []
    for i, c in enumerate(text):
        depth += c == "("
        depth -= c == ")"
        if c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def evaluate(css: str, env: dict[str, str]) -> Rgba:
    """The colour a CSS colour value computes to in a theme (``env``)."""
    css = css.strip()
    if css == "currentColor":
        return parse_color(env["text"])
    if css.startswith("#"):
        return parse_color(css)
    if css.startswith("var("):
        name, fallback = _split_args(css[4:-1])
        return parse_color(env[name]) if name in env else evaluate(fallback, env)
    if css.startswith("color-mix("):
        space, first, second = _split_args(css[10:-1])
        assert space == "in srgb"
        color, percent = first.rsplit(" ", 1)
        return mix(evaluate(color, env), evaluate(second, env), float(percent.rstrip("%")))
    return parse_color(css)


def role_contrast(role: theme.Role, env: dict[str, str]) -> float:
    return contrast(evaluate(role.css, env), parse_color(env["background"]))


# -- tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", THEMES)
@pytest.mark.parametrize("role", ROLES.values(), ids=list(ROLES))
def test_role_reads_in_theme(role: theme.Role, name: str) -> None:
    """Text reaches WCAG AA (4.5:1) in each theme; bar graphics 3:1."""
    needed = 4.5 if role.text else 3.0
    assert role_contrast(role, THEMES[name]) >= needed


@pytest.mark.parametrize("role", ROLES.values(), ids=list(ROLES))
def test_fallback_reads_on_light_and_dark(role: theme.Role) -> None:
    """The fixed fallback alone (no theme, no mixing) reaches 3:1 on every background."""
    for background in FIXED_BACKGROUNDS:
        assert contrast(parse_color(role.fallback), parse_color(background)) >= 3.0


def test_theme_cases_define_every_variable() -> None:
    """A typo in a role's variable name would silently fall back: each theme of its front
    end must define it."""
    for name, env in THEMES.items():
        for role in ROLES.values():
            if name.startswith("JupyterLab"):
                assert role.jupyter in env, (name, role.jupyter)
            elif name.startswith("VS Code"):
                assert role.vscode in env, (name, role.vscode)


def test_roles_are_told_apart_in_the_terminal() -> None:
    """The HTML export finds a role by its terminal colour: no two roles share one."""
    terminals = [role.terminal for role in ROLES.values()]
    assert len(set(terminals)) == len(terminals)
    for name, role in ROLES.items():
        assert theme.css(theme.style(name)) == f"color:{role.css}"
    assert theme.css(theme.style("error", bold=True)).endswith(";font-weight:bold")


# -- every colour the renderers emit ---------------------------------------------------------

_COLOR_RULE = re.compile(r"[\s;\"]color:\s*([^;\"]+)")
_HEX = re.compile(r"#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b")


def _golden_html() -> dict[str, str]:
    from test_golden import ALL_CASES, _rendered

    return {case: _rendered(case)._repr_mimebundle_()["text/html"] for case in ALL_CASES}


def test_every_emitted_colour_is_a_role_or_reads_everywhere() -> None:
    """Scan the HTML of every golden case (the history chart's SVG included): each CSS
    colour is a palette role, and every fixed hex (var() fallbacks, chart lines) reaches
    3:1 on white, #111111 and #1f1f1f."""
    role_css = {role.css for role in ROLES.values()}
    seen_roles: set[str] = set()
    for case, html in _golden_html().items():
        for value in _COLOR_RULE.findall(html):
            assert value.strip() in role_css, (case, value)
            seen_roles.add(value.strip())
        for hex_color in set(_HEX.findall(html)) - {"#010203"}:
            for background in FIXED_BACKGROUNDS:
                ratio = contrast(parse_color(hex_color), parse_color(background))
                assert ratio >= 3.0, (case, hex_color, background, round(ratio, 2))
    # the scan saw the colours that matter: errors, warnings, the bar, BatchNorm lines
    for name in ("error", "warning", "ok", "dim", "bn", "bar_done", "bar_todo"):
        assert ROLES[name].css in seen_roles, name


def test_old_fixed_colours_fail_where_the_new_ones_pass() -> None:
    """The colours rich exported before (chosen for white) are what this guards against."""
    old = {"bn": "#800080", "error": "#800000", "bar_todo": "#3a3a3a"}
    for name, hex_color in old.items():
        assert contrast(parse_color(hex_color), parse_color("#111111")) < 3.0
        assert role_contrast(ROLES[name], THEMES["JupyterLab dark"]) >= 3.0


def test_a_mix_with_the_outputs_grey_text_fell_short_in_vs_code_light() -> None:
    """VS Code writes an output's text in its grey workbench foreground (#616161 in the
    light themes): "warning" and "frozen" mixed with it read 3.98:1 and 4.22:1. Mixed
    with the editor's foreground instead they reach 4.5:1."""
    env = THEMES["VS Code Light Modern"]
    for name in ("warning", "frozen"):
        role = ROLES[name]
        with_grey = f"color-mix(in srgb, {role.chain} {role.mix}%, currentColor)"
        grey = contrast(
            evaluate(with_grey.replace("currentColor", "#616161"), env), (255, 255, 255, 1)
        )
        assert grey < 4.5 <= role_contrast(role, env), name


# -- colour vision deficiencies --------------------------------------------------------------

# Machado, Oliveira & Fernandes (2009), severity 1, applied in linear RGB
_CVD = {
    "protanopia": (
        (0.152286, 1.052583, -0.204868),
        (0.114503, 0.786281, 0.099216),
        (-0.003882, -0.048116, 1.051998),
    ),
    "deuteranopia": (
        (0.367322, 0.860646, -0.227968),
        (0.280085, 0.672501, 0.047413),
        (-0.011820, 0.042940, 0.968881),
    ),
    "tritanopia": (
        (1.255528, -0.076749, -0.178779),
        (-0.078411, 0.930809, 0.147602),
        (0.004733, 0.691367, 0.303900),
    ),
}


def _seen(color: Rgba, matrix) -> tuple[float, ...]:
    """The colour as the deficiency shows it, in 0..255 sRGB."""

    def linear(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    def encoded(c: float) -> float:
        c = min(max(c, 0.0), 1.0)
        return 255 * (12.92 * c if c <= 0.0031308 else 1.055 * c ** (1 / 2.4) - 0.055)

    rgb = [linear(c) for c in color[:3]]
    return tuple(encoded(sum(m * c for m, c in zip(row, rgb, strict=True))) for row in matrix)


def _apart(first: str, second: str, deficiency: str) -> float:
    """The smallest distance (sRGB, 0..441) between two roles' colours over every theme
    under a deficiency: composited on the theme's background, as the reader sees them."""
    distances = []
    matrix = _CVD[deficiency]
    for env in THEMES.values():
        background = parse_color(env["background"])
        a = over(evaluate(ROLES[first].css, env), background)
        b = over(evaluate(ROLES[second].css, env), background)
        seen_a, seen_b = _seen(a, matrix), _seen(b, matrix)
        distances.append(sum((x - y) ** 2 for x, y in zip(seen_a, seen_b, strict=True)) ** 0.5)
    return min(distances)


@pytest.mark.parametrize("deficiency", ["protanopia", "deuteranopia"])
def test_trainable_and_frozen_differ_for_colour_blind_readers(deficiency: str) -> None:
    """The summary's states: green "trainable" against blue "frozen" stays apart in every
    theme for the red-green deficiencies (about 1 man in 12), where the teal it replaced
    came within 82. (Tritanopia, about 1 in 10,000, sees blue and green closer; the
    state is written out in words as well.)"""
    assert _apart("ok", "frozen", deficiency) >= 120
    assert _apart("ok", "info", deficiency) < 100
