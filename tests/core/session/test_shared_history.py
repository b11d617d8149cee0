"""One model, one history: the notebook's magics and a Python ``Session`` on
the same model share one undo history, a second session with commands of its own is
refused by name, and commands from two threads on one model never interleave (a command
waits for another, and is refused in one line while a fit runs)."""

from __future__ import annotations

import gc
import threading
import weakref
from collections import OrderedDict

import pytest
import torch
from IPython.utils.capture import capture_output
from torch import nn

from snapshots import equal
from torchmagic import Session, TorchMagicError
from torchmagic.core.session import shared
from torchmagic.magics.extension import loaded


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            layer1=nn.Linear(6, 8),
            act1=nn.ReLU(),
            layer2=nn.Linear(8, 8),
            act2=nn.ReLU(),
            fc=nn.Linear(8, 3),
        )
    )


def _trained(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    torch.manual_seed(1)
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    opt.zero_grad()


def _snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        "flags": {n: p.requires_grad for n, p in model.named_parameters()},
        "weights": {n: p.detach().clone() for n, p in model.named_parameters()},
        "groups": [
            ([names.get(id(p), "?") for p in g["params"]], g["lr"]) for g in opt.param_groups
        ],
        "state": {names[id(p)]: {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()},
    }


def _consistent(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """Every trainable parameter in exactly one group, no frozen one in any."""
    held = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(held) == len(set(held))
    for name, p in model.named_parameters():
        assert (id(p) in held) == p.requires_grad, name


def _python_session() -> tuple[nn.Module, torch.optim.Optimizer, Session]:
    """A script's Session on a model of its own, with one command in its history."""
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tm = Session(model, opt, owner="train.py")
    tm.freeze("layer1")
    return model, opt, tm


@pytest.fixture
def notebook(ip):
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _trained(model, opt)
    ip.user_ns.update(net=model, opt=opt)
    return ip, model, opt


def _magic(ip, line: str) -> None:
    name, _, rest = line.partition(" ")
    with capture_output():
        ip.run_line_magic(name, rest)


def test_the_magics_and_a_python_session_undo_in_one_order(notebook):
    ip, model, opt = notebook
    before = _snapshot(model, opt)
    _magic(ip, "freeze layer1")
    after_magic = _snapshot(model, opt)
    tm = Session(model, opt)  # a script's session on the model the notebook edits
    assert tm._history is loaded(ip).session._history
    tm.freeze("layer2")
    assert [e.modules for e in tm.history()] == [("layer1",), ("layer2",)]
    _magic(ip, "tm undo")  # the newest command on the model: the Session's freeze
    assert equal(_snapshot(model, opt), after_magic)
    _consistent(model, opt)
    tm.undo()  # then the notebook's
    assert equal(_snapshot(model, opt), before)
    _consistent(model, opt)
    with pytest.raises(TorchMagicError, match="nothing to undo"):
        tm.undo()


def test_by_hand_the_same_two_freezes_and_their_undo(notebook):
    ip, model, opt = notebook
    mirror = _net()
    hand = torch.optim.AdamW(mirror.parameters(), lr=1e-2)
    _trained(mirror, hand)
    _magic(ip, "freeze layer1")
    Session(model, opt).freeze("layer2")
    _magic(ip, "tm undo")  # the Session's freeze undone: layer1 stays frozen
    _trained(model, opt)
    # by hand: layer1 frozen and out of its group, then a step
    mirror.layer1.requires_grad_(False)
    frozen = {id(p) for p in mirror.layer1.parameters()}
    hand.param_groups[0]["params"] = [
        p for p in hand.param_groups[0]["params"] if id(p) not in frozen
    ]
    _trained(mirror, hand)
    for (n, a), b in zip(model.named_parameters(), mirror.parameters(), strict=True):
        assert torch.equal(a, b), n
    assert [len(g["params"]) for g in opt.param_groups] == [len(hand.param_groups[0]["params"])]


def test_a_second_session_with_its_own_commands_is_refused_by_name(notebook):
    ip, model, opt = notebook
    other = _net()
    tm = Session(namespace={"model": model, "optimizer": opt, "other": other})
    tm.freeze("other.layer1")  # its own history now has a command
    _magic(ip, "freeze layer1")  # the notebook's history holds `net`
    before = _snapshot(model, opt)
    with pytest.raises(TorchMagicError) as refused:
        tm.freeze("model.layer2")
    text = str(refused.value)
    assert "\n" not in text and "the notebook's magics" in text
    assert equal(_snapshot(model, opt), before)


def test_the_refusal_names_the_python_session_that_owns_the_history(ip):
    model, opt, tm = _python_session()  # the Session's history holds the model
    ip.user_ns.update(spare=_net())
    _magic(ip, "freeze spare.layer1")  # the notebook's own history is no longer blank
    ip.user_ns.update(net=model, opt=opt)
    with pytest.raises(TorchMagicError) as refused:
        loaded(ip).session.freeze("net.layer2")
    assert "another torchmagic session, train.py:" in str(refused.value)
    assert model.layer2.weight.requires_grad  # unchanged: still trainable


def test_a_blank_notebook_session_takes_the_python_sessions_history(ip):
    model, opt, tm = _python_session()
    ip.user_ns.update(net=model, opt=opt)
    _magic(ip, "tm undo")  # the notebook's first command: the Session's freeze undone
    assert loaded(ip).session._history is tm._history
    assert all(p.requires_grad for p in model.parameters())


def test_undo_takes_only_the_sessions_own_models(notebook):
    ip, model, opt = notebook
    b = _net()
    ip.user_ns.update(b=b)
    _magic(ip, "freeze net.layer1")
    tm = Session(model, opt)
    _magic(ip, "freeze b.layer1")  # newer, on a model the Session does not know
    tm.undo()  # net's freeze, not b's
    assert all(p.requires_grad for p in model.parameters())
    assert not any(p.requires_grad for p in b.layer1.parameters())


def test_a_command_waits_for_another_threads_command(notebook):
    ip, model, opt = notebook
    tm = loaded(ip).session
    _magic(ip, "freeze layer1")
    order: list[str] = []
    holding, release = threading.Event(), threading.Event()

    def long_command() -> None:
        with shared.exclusive(tm):  # as a command in another thread holds it
            holding.set()
            release.wait(10)
            order.append("other thread")

    worker = threading.Thread(target=long_command)
    worker.start()
    holding.wait(10)
    timer = threading.Timer(0.3, release.set)
    timer.start()
    tm.undo()  # waits for the other thread's command to end
    order.append("undo")
    worker.join()
    assert order == ["other thread", "undo"]
    assert all(p.requires_grad for p in model.parameters())


class _Blocking:
    """A fit observer that stops the fit at its first step until told to go on."""

    refresh_seconds = 0.0

    def __init__(self) -> None:
        self.stepping, self.go = threading.Event(), threading.Event()

    def on_start(self, start) -> None: ...

    def on_step(self, info) -> None:
        self.stepping.set()
        self.go.wait(10)

    def on_validation_start(self, epoch, batches) -> None: ...

    def on_epoch(self, metrics) -> None: ...

    def on_unfreeze(self, event) -> None: ...

    def close(self) -> None: ...


def test_a_command_while_a_fit_runs_in_another_thread_is_refused_in_one_line(notebook):
    ip, model, opt = notebook
    tm = loaded(ip).session
    torch.manual_seed(2)
    data = [(torch.randn(4, 6), torch.randint(0, 3, (4,))) for _ in range(2)]
    observer = _Blocking()
    errors: list[BaseException] = []

    def train() -> None:
        try:
            tm.fit(data, model="net", observer=observer)
        except BaseException as error:  # noqa: BLE001 - reported by the assert below
            errors.append(error)

    worker = threading.Thread(target=train)
    worker.start()
    assert observer.stepping.wait(10)
    before = _snapshot(model, opt)
    try:
        with pytest.raises(TorchMagicError) as refused:
            tm.freeze("net.layer1")
        assert equal(_snapshot(model, opt), before)  # nothing changed
    finally:
        observer.go.set()
        worker.join(30)
    text = str(refused.value)
    assert "\n" not in text and "a fit is running" in text
    assert not errors
    tm.freeze("net.layer1")  # the fit is over: it runs
    assert not any(p.requires_grad for p in model.layer1.parameters())


def test_an_undo_loop_in_a_thread_while_magics_run_leaves_no_stale_adapter(notebook):
    ip, model, opt = notebook
    tm = loaded(ip).session
    stop = threading.Event()
    refusals: list[str] = []

    def undo_loop() -> None:
        while not stop.is_set():
            try:
                tm.undo()
            except TorchMagicError as refused:
                refusals.append(str(refused))

    worker = threading.Thread(target=undo_loop)
    worker.start()
    try:
        for _ in range(15):
            for line in ("lora layer1-2 r=2", "freeze fc", "unfreeze fc"):
                try:
                    _magic(ip, line)
                except Exception:  # a refusal: printed by the magic, nothing changed
                    pass
                with shared.exclusive(tm):  # a consistent moment between commands
                    _consistent(model, opt)
    finally:
        stop.set()
        worker.join(30)
    _consistent(model, opt)
    params = {id(p) for p in model.parameters()}
    assert all(id(p) in params for g in opt.param_groups for p in g["params"])


def test_the_registry_of_histories_keeps_neither_a_model_nor_its_history_alive():
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tm = Session(model, opt)
    tm.replace_head("fc", 5)  # its undo log holds the old head and the model's parts
    model_ref, history_ref = weakref.ref(model), weakref.ref(tm._history)
    del tm, model, opt
    gc.collect()
    assert model_ref() is None and history_ref() is None


def test_the_doctor_names_a_history_held_by_another_session_before_any_command(ip):
    model, opt, tm = _python_session()
    ip.user_ns.update(spare=_net())
    _magic(ip, "freeze spare.layer1")  # the notebook's history has its own commands
    ip.user_ns.update(net=model, opt=opt)
    found = {f.check: f for f in loaded(ip).session.doctor().findings}
    finding = found["history-elsewhere"]
    assert finding.subject == "net" and "session, train.py:" in finding.message
    assert "history-elsewhere" not in {f.check for f in tm.doctor().findings}  # its own


def test_a_blank_notebook_sessions_first_command_holds_the_shared_lock(ip):
    model, opt, tm = _python_session()
    ip.user_ns.update(net=model, opt=opt)
    held: list[bool] = []
    lock = tm._history.lock
    real_acquire = lock.acquire

    def acquire(*args, **kwargs):  # records whose lock the command takes
        held.append(True)
        return real_acquire(*args, **kwargs)

    tm._history.lock = type(
        "Spy", (), {"acquire": staticmethod(acquire), "release": lock.release}
    )()
    try:
        _magic(ip, "freeze net.layer2")  # the notebook's first command
    finally:
        tm._history.lock = lock
    assert loaded(ip).session._history is tm._history and held
    assert [e.modules for e in tm.history()] == [("layer1",), ("layer2",)]


def test_undo_is_not_refused_for_another_model_whose_history_is_elsewhere():
    a, b = _net(), _net()
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1)
    other = Session(b, opt_b)
    other.freeze("layer1")  # b's history is that Session's
    tm = Session(namespace={"a": a, "opt_a": opt_a})
    tm.freeze("a.layer1")  # this session has commands of its own
    tm.workspace.namespace.update(b=b, opt_b=opt_b)  # and b is bound here too
    tm.undo()  # a's freeze: b's history has nothing to do with it
    assert all(p.requires_grad for p in a.parameters())
    assert not any(p.requires_grad for p in b.layer1.parameters())
    assert other.history()  # b's stays where it was


def test_a_session_without_an_owner_is_named_by_the_model_it_was_given(ip):
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tm = Session(model, opt)
    tm.freeze("layer1")  # its history holds the model while ``tm`` lives
    ip.user_ns.update(spare=_net())
    _magic(ip, "freeze spare.layer1")
    ip.user_ns.update(net=model, opt=opt)
    with pytest.raises(TorchMagicError, match="session, a Python Session on a Sequential:"):
        loaded(ip).session.freeze("net.layer2")
