"""The command grammar: target paths (``layer1-3``, ``features.0-6``, ``"*.bn*"``), peft's
lists of name endings (``q_proj,v_proj``) and ``key=value`` options (``lr=1e-4``,
``lr=1e-5:1e-4``, ``wd=0.01``).

A small hand-written parser: user text is matched against fixed patterns and never evaluated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from ..errors import TorchMagicError

# ASCII only: ``str.isdigit`` and ``\d`` accept "²" and "١", which ``int`` then rejects or reads.
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_NAME_RE = re.compile(rf"^{_NAME}$")
_INDEX_RE = re.compile(r"^-?[0-9]+$")
_RANGE_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*?)?([0-9]+)-([0-9]+)$")
_GLOB_CHARS = frozenset("*?[")
_FLOAT_RE = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$")
_COUNT_RE = re.compile(r"^[+-]?[0-9]+$")
# Longer digit runs name no module and no size: refused before ``int`` reads them (Python
# refuses over 4300 digits; torch overflows past 2**63).
MAX_DIGITS = 18
# An input of more elements than this fits no device (4 TiB of float32).
MAX_INPUT_ELEMENTS = 2**40


@dataclass(frozen=True)
class Segment:
    """One dotted part of a path: a child name, an index, or a numbered range."""

    text: str
    prefix: str = ""
    start: int | None = None
    stop: int | None = None

    @property
    def is_range(self) -> bool:
        return self.start is not None

    def names(self) -> Iterator[str]:
        """The child names this segment stands for (a range expands to several), lazily:
        resolving stops at the first missing one, so ``layer1-30000000`` costs what the
        real children do."""
        if self.start is None or self.stop is None:
            yield self.text
            return
        for i in range(self.start, self.stop + 1):
            yield f"{self.prefix}{i}"


@dataclass(frozen=True)
class Target:
    """A parsed target: a dotted path of segments, a glob on qualified names, or peft's
    ``target_modules`` spelling: name endings, each matching every module whose path ends
    with it component by component (``c_attn`` matches ``transformer.h.0.attn.c_attn``)."""

    text: str
    segments: tuple[Segment, ...] = ()
    glob: str | None = None
    suffixes: tuple[str, ...] = ()

    @property
    def head(self) -> str | None:
        """The first segment when it could name a variable, else None."""
        if self.segments and _NAME_RE.match(self.segments[0].text):
            return self.segments[0].text
        if self.glob is not None and "." in self.glob:
            first = self.glob.split(".", 1)[0]
            if _NAME_RE.match(first):
                return first
        return None

    def without_head(self) -> Target:
        """The same target relative to the variable named by its first segment."""
        if self.glob is not None:
            rest = self.glob.split(".", 1)[1]
            return Target(text=self.text, glob=rest)
        return Target(text=self.text, segments=self.segments[1:])

    @property
    def is_whole(self) -> bool:
        """True when the target names its root itself (no path below it)."""
        return self.glob is None and not self.segments and not self.suffixes


def is_name(text: str) -> bool:
    """A Python-style identifier in ASCII: one component of a module path."""
    return bool(_NAME_RE.match(text))


def is_index(text: str) -> bool:
    """``3`` or ``-1`` in ASCII digits, short enough for ``int``."""
    return bool(_INDEX_RE.match(text)) and len(text.lstrip("-")) <= MAX_DIGITS


def parse_segment(text: str, target: str) -> Segment:
    """Parse one dotted part; ``target`` is the whole text, for the error message."""
    if _NAME_RE.match(text):
        return Segment(text)
    if re.search(rf"[0-9]{{{MAX_DIGITS + 1}}}", text):
        raise TorchMagicError(
            f"bad target '{target}': '{text}' holds a number too large to be an index"
        )
    if _INDEX_RE.match(text):
        return Segment(text)
    match = _RANGE_RE.match(text)
    if match:
        prefix, start, stop = match.group(1) or "", int(match.group(2)), int(match.group(3))
        if start > stop:
            raise TorchMagicError(
                f"bad range '{text}' in '{target}': the first number must not exceed the last"
            )
        return Segment(text, prefix, start, stop)
    raise TorchMagicError(
        f"bad target '{target}': '{text}' is not a name, an index or a range like layer1-3"
    )


def parse_suffixes(text: str) -> Target:
    """peft's spelling ``q_proj,v_proj`` (a trailing comma makes a list of one:
    ``c_attn,``): dotted names, each a path ending."""
    names = text.split(",")
    if len(names) > 1 and not names[-1].strip():
        names.pop()
    names = [name.strip() for name in names]
    for name in names:
        if not name or not all(is_name(p) or p.isdigit() for p in name.split(".")):
            raise TorchMagicError(
                f"bad target '{text}': '{name}' is not a module name (peft's spelling: "
                "names like q_proj,v_proj, each matching every module whose path ends so)"
            )
    return Target(text=text, suffixes=tuple(dict.fromkeys(names)))


def suffix_list(names: Sequence[str]) -> str:
    """``["q_proj", "v_proj"]`` (peft's ``target_modules``) as the text
    :func:`parse_suffixes` reads back: ``q_proj,v_proj``, or ``c_attn,`` for one name."""
    if isinstance(names, str) or not names or not all(isinstance(n, str) for n in names):
        raise TorchMagicError(
            f"a list of targets holds module names, got {names!r}", param="targets"
        )
    return ",".join(names) + ("," if len(names) == 1 else "")


def parse_target(text: str) -> Target:
    """Parse ``model.layer1-3``, ``features.0-6``, ``-1``, a glob such as ``*.bn*`` or
    peft's ``q_proj,v_proj``."""
    text = text.strip()
    if not text:
        raise TorchMagicError("empty target")
    if any(c in _GLOB_CHARS for c in text):
        return Target(text=text, glob=text)
    if "," in text:
        return parse_suffixes(text)
    parts = text.split(".")
    if any(not p for p in parts):
        raise TorchMagicError(f"bad target '{text}': empty part between dots")
    return Target(text=text, segments=tuple(parse_segment(p, text) for p in parts))


def parse_targets(texts: Iterable[str]) -> tuple[Target, ...]:
    return tuple(parse_target(t) for t in texts)


def check_positive(value: float, key: str, *, allow_zero: bool = False) -> float:
    """``value`` as a float when it is a finite number > 0 (or >= 0), else a refusal.

    Only numbers: text is the grammar's to parse (:func:`parse_positive_float`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TorchMagicError(
            f"{key} must be a number, got {type(value).__name__} {value!r}", param=key
        )
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise TorchMagicError(
            f"bad value {key}={value:g}: must be a finite number {bound}", param=key
        )
    return value


def parse_positive_float(text: str, key: str, *, allow_zero: bool = False) -> float:
    """A finite float > 0 (or >= 0), from a strict pattern: ``1e-4``, ``0.01``."""
    if not _FLOAT_RE.match(text.strip()):
        raise TorchMagicError(f"bad value {key}={text}: expected a number such as 1e-4", param=key)
    return check_positive(float(text), key, allow_zero=allow_zero)


LrSpec = float | tuple[float, float] | None


def parse_lr(text: str) -> float | tuple[float, float]:
    """``lr=1e-4`` or the discriminative spread ``lr=1e-5:1e-4``."""
    if ":" in text:
        first, _, last = text.partition(":")
        if not first.strip() or not last.strip():
            raise TorchMagicError(
                f"lr={text}: a discriminative range needs both ends, e.g. lr=1e-5:1e-4 "
                "(the first block's lr, then the last one's)",
                param="lr",
            )
        return (parse_positive_float(first, "lr"), parse_positive_float(last, "lr"))
    return parse_positive_float(text, "lr")


def parse_weight_decay(text: str) -> float:
    """``wd=0.01``; zero is allowed (no decay)."""
    return parse_positive_float(text, "wd", allow_zero=True)


def split_options(
    tokens: Sequence[str], allowed: Sequence[str]
) -> tuple[list[str], dict[str, str]]:
    """Separate ``key=value`` tokens from target tokens; unknown keys are refused."""
    targets: list[str] = []
    options: dict[str, str] = {}
    for token in tokens:
        key, eq, value = token.partition("=")
        if not eq or any(c in _GLOB_CHARS for c in key):
            targets.append(token)
            continue
        if key not in allowed:
            known = ", ".join(f"{k}=" for k in allowed) or "none"
            raise TorchMagicError(f"unknown option '{key}=': allowed here: {known}")
        if key in options:
            raise TorchMagicError(f"option '{key}=' given twice")
        if not value:
            raise TorchMagicError(f"option '{key}=' needs a value")
        options[key] = value
    return targets, options


def spread_lrs(lr: LrSpec, count: int) -> list[float | None]:
    """One lr per block: a single value for all, or a geometric spread first..last."""
    if lr is None or isinstance(lr, float):
        return [lr] * count
    first, last = lr
    if count == 1:
        return [last]
    # first**(1-t) * last**t: each factor lies between 1 and its base, so no step
    # overflows where the ratio last/first would (1e-300:1e300)
    return [first ** (1 - i / (count - 1)) * last ** (i / (count - 1)) for i in range(count)]


def parse_count(text: str, key: str) -> int:
    """A whole number from a strict ASCII pattern (``10``, never ``١٠`` or ``1e3``); its
    range is the caller's to check."""
    text = text.strip()
    if not _COUNT_RE.match(text):
        raise TorchMagicError(f"{key} must be a whole number, got '{text}'", param=key)
    if len(text.lstrip("+-")) > MAX_DIGITS:
        raise TorchMagicError(f"{key}={text[:12]}…: too large", param=key)
    return int(text)


def parse_shape(text: str) -> tuple[int, ...]:
    """``1,3,224,224`` (or ``1x3x224x224``) → (1, 3, 224, 224): digits only, never evaluated."""
    parts = [p.strip() for p in text.replace("x", ",").split(",")]
    if not all(p.isascii() and p.isdigit() and len(p) <= MAX_DIGITS and int(p) > 0 for p in parts):
        raise TorchMagicError(
            f"input_shape={text}: expected positive integers like 1,3,224,224",
            param="input_shape",
        )
    shape = tuple(int(p) for p in parts)
    if math.prod(shape) > MAX_INPUT_ELEMENTS:
        raise TorchMagicError(
            f"input_shape={text}: {math.prod(shape):.3g} elements, more than any device holds",
            param="input_shape",
        )
    return shape


_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BYTES = re.compile(r"^\s*([0-9]{1,18}(?:\.[0-9]{1,9})?)\s*([a-zA-Z]*)\s*$")  # ASCII digits only


def parse_bytes(text: str, param: str = "budget") -> int:
    """``8GiB``, ``512MB`` or plain digits → bytes; never evaluated."""
    match = _BYTES.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _BYTE_UNITS:
        raise TorchMagicError(
            f"{param}={text}: expected a size like 8GiB, 512MiB or 2000000000", param=param
        )
    size = int(float(match.group(1)) * _BYTE_UNITS[unit])
    if size <= 0:
        raise TorchMagicError(f"{param}={text}: a size must be positive", param=param)
    return size


def parse_labels(text: str) -> tuple[str, ...]:
    """``cat,dog,bird`` → the class names, in order (empty names refused)."""
    names = tuple(name.strip() for name in text.split(","))
    if not names or any(not name for name in names):
        raise TorchMagicError(f"labels={text}: expected names like cat,dog,bird", param="labels")
    if len(set(names)) != len(names):
        raise TorchMagicError(f"labels={text}: names must differ", param="labels")
    return names
