"""No host sync per training step: the loop reads its losses at check points
only. Counted on the CPU by patching every Tensor method that copies a value to Python."""

import pytest
import torch

from test_fit import mlp
from test_fit_failures import clock  # noqa: F401  (fixture)
from torchmagic import Session

# Ways a tensor's value reaches the host as a Python value; on a GPU each one waits for
# every kernel queued before it.
HOST_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")
STEPS = 60


class Redraws:
    refresh_seconds = 0.5  # every check point is a redraw

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_start(self, start):
        pass

    def on_step(self, info):
        self.steps.append(info.step)

    def on_epoch(self, metrics):
        pass

    def close(self):
        pass


@pytest.fixture
def host_reads(monkeypatch):
    counts = {name: 0 for name in HOST_READS}
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g))] * n


def test_host_reads_are_bounded_by_check_points_not_steps(clock, host_reads):  # noqa: F811
    clock.tick = 0.1  # a check point (and a redraw) every 5 steps
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # reads no values
    tm = Session(model, opt)
    observer = Redraws()
    train = batches(STEPS // 2)
    before = sum(host_reads.values())
    history = tm.fit(train, epochs=2, observer=observer)
    reads = sum(host_reads.values()) - before
    assert history.steps == STEPS and history.stop_reason is None
    assert 0 < len(observer.steps) <= STEPS // 4
    epochs = len(history.epochs)
    assert reads <= len(observer.steps) + epochs, host_reads  # one read per check point


def test_every_step_is_read_when_the_observer_asks_for_it(clock, host_reads):  # noqa: F811
    """The counter works: with a redraw after every step there is a read per step."""
    clock.tick = 1.0
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    observer = Redraws()
    history = Session(model, opt).fit(batches(STEPS), observer=observer)
    assert history.steps == STEPS and len(observer.steps) == STEPS
    assert sum(host_reads.values()) >= STEPS
