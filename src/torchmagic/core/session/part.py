"""The base of Session's front-door parts (surgery, training, devices): each part is a
mixin of :class:`Session` only, so it reaches the whole session it is part of."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from .facade import Session


class SessionPart:
    """One domain's thin methods of :class:`Session`, kept in their own file so that no
    class is a wall of 45 methods; never used on its own."""

    @property
    def _session(self) -> Session:
        """This object as the Session it is part of (for the type checker)."""
        return cast("Session", self)
