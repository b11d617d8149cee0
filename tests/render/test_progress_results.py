"""%fit, %lr_find and %fine_tune show their result where the progress was, wherever the
magic sits in the cell, once; and return it (in a real shell: cells run with history,
as a front end runs them)."""

import pytest
from IPython.utils.capture import capture_output

from builders import TRAINING_CELL
from shells import fresh_shell
from torchmagic.magics.shown import ShownResult

# the training magics' three blobs, with a cosine schedule bound
SETUP = TRAINING_CELL + "cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 10)\n"


def cell(ip, source):
    """Run ``source`` as a front end runs a cell; its display outputs' text, its stdout
    (where a plain shell writes the cell's value) and the value."""
    with capture_output() as cap:
        result = ip.run_cell(source, store_history=True)
    result.raise_error()
    return [o.data["text/plain"] for o in cap.outputs], cap.stdout, result.result


def results(texts, marker):
    return [t for t in texts if marker in t]


@pytest.fixture
def shell(ip):
    cell(ip, SETUP)
    return ip


def test_fit_on_the_last_line_shows_its_result_once(shell):
    texts, stdout, value = cell(shell, "%fit train --val val --epochs 2")
    (shown,) = results(texts, "completed")  # the result, once
    assert texts[-1] == shown  # drawn last, in the progress's place
    assert shown.startswith("fit 1 · model · fp32 · 12 steps")
    assert "schedulers: CosineAnnealingLR per epoch" in shown
    assert "completed" not in stdout  # the cell's value adds nothing
    assert isinstance(value, ShownResult) and len(value.epochs) == 2


def test_fit_inside_a_cell_shows_its_result_and_returns_it(shell):
    texts, stdout, _ = cell(shell, "h = %fit train --val val --epochs 2\nprint('after')")
    (shown,) = results(texts, "completed")
    assert stdout == "after\n"
    history = shell.user_ns["h"]
    assert history.epochs[-1].val_accuracy is not None and history.steps == 12
    assert str(history) == shown
    # a later cell shows it again, as any value
    texts, _, value = cell(shell, "h")
    assert value is history and results(texts, "completed") == [shown]
    # asked again in the cell that ran it: still once
    texts, _, _ = cell(shell, "g = %fit train --epochs 1\ndisplay(g)\ng")
    assert len(results(texts, "completed")) == 1


def test_the_live_view_is_replaced_not_repeated(shell):
    """The run's facts once: the closed progress says how many epochs ran, the result
    says the rest; no second summary line."""
    texts, _, _ = cell(shell, "%fit train --val val --epochs 2")
    closed = [t for t in texts if "epochs in" in t]
    assert closed and closed[-1].splitlines()[-1].startswith("2 of 2 epochs in ")
    assert "epochs in" not in texts[-1] and "epochs done" not in texts[-1]


def test_lr_find_with_apply_inside_a_cell_says_it_applied(shell):
    before = [g["lr"] for g in shell.user_ns["optimizer"].param_groups]
    texts, _, _ = cell(shell, "found = %lr_find train --steps 30 --apply\nx = 1")
    found = shell.user_ns["found"]
    (shown,) = results(texts, "lr_find · model · 30 steps")
    assert found.suggestion is not None and found.applied is not None
    assert "applied: base lr of group 0 = " in shown
    assert [g["lr"] for g in shell.user_ns["optimizer"].param_groups] != before
    assert "CosineAnnealingLR: not stepped" in shown
    assert "⠀" in shown and "▲" in shown  # the curve, in text


def test_fine_tune_reads_in_the_order_it_ran(shell):
    texts, _, value = cell(shell, "%fine_tune train --val val --epochs 2")
    shown = texts[-1]
    order = [shown.index(s) for s in ("froze everything except 2", "fit 1 ·", "unfroze", "fit 2 ·")]
    assert order == sorted(order)
    assert shown.count("completed") == 2
    closed = [t.splitlines()[-1] for t in texts if " epoch" in t and " in 00:" in t]
    assert "1 of 1 epoch in" in closed[0] and all("3 of" not in line for line in closed)
    assert any(line.startswith("2 of 2 epochs in") for line in closed)
    assert [len(h.epochs) for h in value.histories] == [1, 2]


def test_a_failing_run_keeps_its_progress_and_shows_no_result(shell):
    shell.user_ns["calls"] = 0
    cell(
        shell,
        """
def boom(output, target):
    global calls
    calls += 1
    if calls > 8:
        raise RuntimeError("boom")
    return nn.functional.cross_entropy(output, target)
""",
    )
    with capture_output() as cap:
        result = shell.run_cell("%fit train --epochs 3 --loss boom", store_history=True)
    assert isinstance(result.error_in_exec, RuntimeError)
    texts = [o.data["text/plain"] for o in cap.outputs]
    assert texts and "completed" not in texts[-1]
    assert texts[-1].splitlines()[-1].startswith("1 of 3 epochs in")


@pytest.fixture
def terminal():
    """terminal IPython's shell (a text ``Out[n]:`` prompt), torchmagic loaded."""
    from IPython.terminal.interactiveshell import TerminalInteractiveShell

    with fresh_shell(TerminalInteractiveShell) as shell:
        cell(shell, SETUP)
        yield shell


def test_a_terminal_prints_no_empty_out_prompt_under_the_result(terminal):
    """A bare %fit ending a cell: the result is on the screen, and the prompt would echo
    an empty ``Out[n]:`` under it; assigned or not last, the value is returned."""
    _, stdout, value = cell(terminal, "%fit train --epochs 1")
    assert "completed" in stdout and "Out[" not in stdout and value is None
    _, stdout, _ = cell(terminal, "h = %fit train --epochs 1\n1 + 1")
    assert isinstance(terminal.user_ns["h"], ShownResult) and "Out[3]: 2" in stdout
    _, stdout, value = cell(terminal, "%fit train --epochs 1\n%lr_find train --steps 5")
    assert value is None and "Out[" not in stdout
