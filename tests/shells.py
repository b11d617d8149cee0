"""In-process IPython shells for the tests, and their disposal.

IPython keeps every shell it made reachable after ``clear_instance()`` (its hooks and
history thread refer to it), and a shell holds its namespace: every test's models and
optimizers stayed in memory, about 200 MB per test of resnet18 in ``tests/magics``, until a
full run's process ran the machine out of memory. The namespace and output cache are
emptied when the shell is discarded, which frees them.
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator
from contextlib import contextmanager

from IPython.core.interactiveshell import InteractiveShell


@contextmanager
def fresh_shell(
    kind: type[InteractiveShell] = InteractiveShell, load: bool = True
) -> Iterator[InteractiveShell]:
    """A new shell of ``kind`` (torchmagic loaded with ``load``), emptied on exit."""
    InteractiveShell.clear_instance()
    kind.clear_instance()
    shell = kind.instance()
    try:
        if load:
            shell.run_line_magic("load_ext", "torchmagic")
        yield shell
    finally:
        kind.clear_instance()
        InteractiveShell.clear_instance()
        # Every shell registers an exit hook that resets its namespace with a full garbage
        # collection; a hundred of them kept the interpreter busy for minutes after the
        # last test. The namespace is emptied here instead.
        atexit.unregister(shell.atexit_operations)
        shell.user_ns.clear()
        shell.user_ns_hidden.clear()
        shell.history_manager.output_hist.clear()
