"""The engine's one front door: every capability a magic has is a Session method, for
notebooks and scripts alike. Notebook: the magics hold one Session over the kernel's
``user_ns``. Script::

    tm = torchmagic.Session(model, optimizer, schedulers=[scheduler])
    tm.freeze("layer1-3")
    tm.replace_head("fc", 10)
    tm.unfreeze("layer4", lr=1e-4)
    tm.undo()

Values are typed (``lr=(1e-5, 1e-4)``, ``input_shape=(8, 3, 224, 224)``); parsing the
text of a magic line is the grammar's job. Refusals name the Python parameter at fault.

``Session`` is one class and a facade: each public method checks what it was given and
hands over to the module of its domain, where what decides things lives:

- ``facade.py``: the Session class (the state it holds and every public method) and
  ``resume``; ``config.py``: SessionConfig.
- ``names.py``: what a call names, resolved to live objects (model, optimizer, modules).
- ``commands.py``: the mutating commands, each run atomically (transaction, history
  record as the commit point, Ctrl-C safe) with the call that replays it.
- ``invariants.py``: what must hold after every command, checked before it is recorded.
- ``undo.py``: undo, the refusals that keep it consistent, releasing stale records.
- ``shared.py``: one model, one history (sessions on one model share it) and its lock, so
  that two threads' commands never interleave.
- ``fit_runs.py``: the fit plan, progressive-unfreezing hooks, lr_find's apply,
  fine_tune's phases, the hand-written loop's step.
- ``hardware.py``: the device a command means, moves, memory, timings and estimates.
- ``save_load.py``: save, load (replaying the saved calls), export as a script.
- ``fsdp.py``: shard with FSDP2, and the checks a sharded save or resume makes.
- ``models.py``: a zoo model built and bound in the namespace.
- ``evaluation.py``: evaluate and predict, with the class names the session knows.
- ``data.py``: load_data, its loaders bound and its class names kept.
"""

from .config import SessionConfig
from .facade import Session, resume

__all__ = ["Session", "SessionConfig", "resume"]
