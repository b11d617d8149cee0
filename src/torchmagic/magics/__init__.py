"""The notebook layer: thin ``Magics`` classes by topic (as IPython splits its own) on a
shared base, all driving one Session that one configurable, ``TorchMagics``, owns.

- surgery: ``%freeze`` ``%unfreeze`` ``%replace_head`` ``%summary``
- data: ``%load_data``
- training: ``%fit`` ``%amp`` ``%%amp``
- evaluation: ``%evaluate`` ``%predict``
- devices: ``%device`` ``%gpumem``
- session: ``%tm``

No torch logic lives here: a magic parses its line, makes one Session call and displays
what the render layer draws. Bad input surfaces as IPython's ``UsageError``: one line, no
traceback, nothing changed.
"""

from .extension import TOPICS, TorchMagics, loaded

__all__ = ["TOPICS", "TorchMagics", "loaded"]
