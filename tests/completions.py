"""Tab completion as IPython's completer API gives it to a front end, for the tests of
every magic's completion."""

from __future__ import annotations

from IPython.core.completer import provisionalcompleter
from IPython.core.interactiveshell import InteractiveShell


def complete(shell: InteractiveShell, text: str) -> list[str]:
    """The candidates for the cursor at the end of ``text``, each checked to replace
    just the word being typed."""
    word = text.split(" ")[-1]
    with provisionalcompleter():
        found = list(shell.Completer.completions(text, len(text)))
    assert all(c.start == len(text) - len(word) and c.end == len(text) for c in found)
    return [c.text for c in found]
