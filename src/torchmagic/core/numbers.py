"""Numbers written one way in every output, as people type them: ``1e-5``, never
``1e-05`` (Python's own ``:g`` pads the exponent), in tables, history, advice and
messages alike."""

from __future__ import annotations


def short(value: float) -> str:
    """Three significant digits; below 0.001 as an exponent, without the exponent's
    padding or plus sign: 0.0001 → '1e-4', 2.45e-06 → '2.45e-6', 0.01 → '0.01',
    0.3 → '0.3', 1234567.0 → '1.23e6'."""
    text = f"{value:.2e}" if value and abs(value) < 1e-3 else f"{value:.3g}"
    mantissa, mark, exponent = text.partition("e")
    if not mark:
        return text
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"
