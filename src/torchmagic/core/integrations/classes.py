"""Recognising another library's classes by name along the MRO, so that the library is
never imported to answer ``isinstance``."""

from __future__ import annotations


def named(obj: object, *names: str) -> bool:
    """Whether ``obj``'s class, or a base class, has one of ``names``."""
    return any(cls.__name__ in names for cls in type(obj).__mro__)


def package_of(obj: object) -> str:
    """The top-level package that defines ``obj``'s class (``accelerate``, ``timm``)."""
    return type(obj).__module__.partition(".")[0]
