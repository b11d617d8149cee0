"""A fuzzer over the command grammar and every registered torchmagic magic: lines built
from plausible tokens (names, ranges, globs, key=value, flags, quotes, backslashes,
unicode digits, huge numbers) and raw text. Every line is one ``UsageError`` or a
success; a refused line changes nothing (model, optimizer, scheduler, session, namespace,
event hooks, grad mode).

A few hundred examples run in the suite, the same ones every run (a suite that fails
only on some runs cannot gate a merge); ``TORCHMAGIC_FUZZ_EXAMPLES=5000`` runs more, drawn
afresh each time, to look for new failures.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from torch import nn

from snapshots import assert_same, snapshot
from torchmagic.core import Session
from torchmagic.magics import loaded

EXAMPLES = int(os.environ.get("TORCHMAGIC_FUZZ_EXAMPLES", "300"))
EXPLORING = "TORCHMAGIC_FUZZ_EXAMPLES" in os.environ


def _block(width: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(width, width, 1), nn.BatchNorm2d(width), nn.ReLU())


def _namespace() -> dict:
    """A tiny model that has trained one step, its optimizer and scheduler, a loader of
    its batches, and variables of the wrong kinds (non-loaders among them)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        OrderedDict(
            stem=nn.Conv2d(3, 4, 3, padding=1),
            bn=nn.BatchNorm2d(4),
            layer1=_block(4),
            layer2=_block(4),
            layer3=_block(4),
            pool=nn.AdaptiveAvgPool2d(1),
            flat=nn.Flatten(),
            fc=nn.Linear(4, 3),
        )
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    model(torch.randn(2, 3, 6, 6)).sum().backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return {
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "x": 5,
        "text": "abc",
        "pairs": [1, 2, 3],
        "table": {"a": 1},
        "batch": torch.randn(4, 3),
        "nothing": None,
        "train_loader": [(torch.randn(2, 3, 6, 6), torch.tensor([0, 2])) for _ in range(2)],
    }


class Fixture:
    """One shell for every example; the namespace and the session are fresh after each
    successful (state-changing) line."""

    def __init__(self) -> None:
        InteractiveShell.clear_instance()
        self.ip = InteractiveShell.instance()
        self.ip.run_line_magic("load_ext", "torchmagic")
        self.extension = loaded(self.ip)
        self.topics = {id(t) for t in self.extension.topics}
        self.line_magics = sorted(
            name
            for name, func in self.ip.magics_manager.magics["line"].items()
            if id(getattr(func, "__self__", None)) in self.topics
        )
        self.cell_magics = sorted(
            name
            for name, func in self.ip.magics_manager.magics["cell"].items()
            if id(getattr(func, "__self__", None)) in self.topics
        )
        self.reset()

    def reset(self) -> None:
        ns = self.ip.user_ns
        for key in [
            k
            for k in ns
            if not k.startswith("_") and k not in ("In", "Out", "exit", "quit", "get_ipython")
        ]:
            del ns[key]
        ns.update(_namespace())
        for topic in self.extension.topics:
            topic.close()  # the memory watch off
        self.extension.session = Session(
            namespace=ns, hidden=self.ip.user_ns_hidden, config=self.extension._session_config()
        )

    def state(self) -> dict:
        ns = self.ip.user_ns
        session = self.extension.session
        return {
            "model": snapshot(ns["model"], ns["optimizer"]),
            "scheduler": ns["scheduler"].state_dict(),
            "variables": {k: id(v) for k, v in ns.items() if not k.startswith("_")},
            "history": [(e.command, e.stale) for e in session.history()],
            "current": session.workspace.current,
            "device": session.device,
            "amp": session.amp_status(),
            "fits": len(session.fits),
            "events": {k: len(v) for k, v in self.ip.events.callbacks.items()},
            "grad_mode": torch.is_grad_enabled(),
        }


@pytest.fixture(scope="module")
def fuzz():
    fixture = Fixture()
    yield fixture
    InteractiveShell.clear_instance()


HUGE = ["99999999999", "100000000000", "9" * 20, "9" * 40, "1" + "0" * 5000]
DIGITS = ["0", "1", "2", "3", "4", "-1", "-2", "12", *HUGE]
UNICODE_DIGITS = ["²", "١", "٣", "߀", "𝟙", "五", "Ⅻ"]
NAMES = [
    "model", "optimizer", "scheduler", "x", "text", "pairs", "table", "batch", "nothing",
    "stem", "bn", "layer1", "layer2", "layer3", "pool", "flat", "fc", "auto", "layr1",
    "model.layer1", "model.fc", "model.layer1.0", "layer2.1", "nope", "module", "_orig_mod",
    "model.module.fc", "In", "get_ipython", "train_loader", "__builtins__", "len", "None",
]  # fmt: skip
WORDS = [
    "history", "undo", "use", "fits", "doctor", "help", "move", "check", "pinbench", "reset",
    "watch", "estimate", "on", "off", "cpu", "cuda", "cuda:0", "cuda:1", "mps", "auto", "meta",
    "bf16", "fp16", "fp32",
]  # fmt: skip
FLAGS = [
    "--except", "--bn", "frozen", "eval", "train", "bogus", "--opt", "--dry-run", "--dropout",
    "--depth", "--epochs", "--max-steps", "--loss", "--val", "--input-shape", "--optimizer",
    "--tracebacks", "--cache-features", "--nope", "-", "--", "-h", "--help", "AdamW", "SGD",
    "LBFGS", "exit", "mse", "cross_entropy", "--accum", "--clip", "--schedule", "one-cycle",
    "--effective-batch",
]  # fmt: skip
GLOBS = ["*.bn*", "*", "?", "[", "]", "layer[12]", "*.*.*", "[!a]*", "model.*", "*.0", "**"]
VALUES = [
    "1e-4", "1e-5:1e-4", "1e-300:1e300", "1e300:1e-300", "0", "-1", "nan", "inf", "-inf",
    "1e999", "abc", "", ":", "1:2:3", "0.5", ".5", "5.", "1e-4:", ":1e-4", "0:1",
]  # fmt: skip
SHAPES = ["1,3,6,6", "2x3x6x6", "0,3", "-1,3,6,6", "1,,3", "99999999999,3,6,6", "9" * 30 + ",3"]
SPECIAL = [
    "'",
    '"',
    "'a b'",
    '"*.bn*"',
    "\\",
    "a\\",
    "\\'",
    "'''",
    "{x}",
    "$x",
    "#",
    ";",
    "=",
    "=1",
]

numbers = st.one_of(st.sampled_from(DIGITS + UNICODE_DIGITS), st.integers(-5, 20).map(str))
ranges = st.builds(
    lambda prefix, a, b: f"{prefix}{a}-{b}",
    st.sampled_from(["layer", "", "model.layer", "model.", "layer1.", "stem", "fc"]),
    numbers,
    numbers,
)
key_values = st.builds(
    lambda key, value: f"{key}={value}",
    st.sampled_from(["lr", "wd", "momentum", "", "LR", "lr ", "*"]),
    st.one_of(st.sampled_from(VALUES + HUGE + UNICODE_DIGITS), st.floats().map(repr)),
)
token = st.one_of(
    st.sampled_from(NAMES),
    st.sampled_from(WORDS),
    st.sampled_from(FLAGS),
    st.sampled_from(GLOBS),
    st.sampled_from(SHAPES),
    st.sampled_from(SPECIAL),
    numbers,
    ranges,
    key_values,
    st.text(max_size=8),
)
# Mostly near-valid lines (a subcommand or target, then a few options), so that many
# succeed and the refusals come from deep in the engine, not only from the parser.
plausible = st.builds(
    lambda first, rest: " ".join([first, *rest]),
    st.one_of(st.sampled_from(NAMES + WORDS + GLOBS), ranges),
    st.lists(
        st.one_of(
            key_values,
            numbers,
            st.sampled_from(NAMES + WORDS),
            st.builds(
                " ".join,
                st.tuples(st.sampled_from(FLAGS), st.sampled_from(NAMES + SHAPES + VALUES)),
            ),
        ),
        max_size=3,
    ),
)
lines = st.one_of(
    plausible,
    st.lists(token, max_size=6).map(" ".join),
    st.text(max_size=30),
)


def _check_line(fuzz: Fixture, name: str, line: str, cell: str | None) -> None:
    before = fuzz.state()
    try:
        with capture_output():
            if cell is None:
                fuzz.ip.find_line_magic(name)(line)
            else:
                fuzz.ip.find_cell_magic(name)(line, cell)
    except UsageError as error:
        assert type(error) is UsageError
        assert "\n" not in str(error), f"a multi-line refusal: {error}"
        assert_same(before["model"], fuzz.state()["model"])
        after = fuzz.state()
        for key in before:
            if key != "model":
                assert before[key] == after[key], f"%{name} {line!r}: {key} changed"
    else:
        lrs = [g["lr"] for g in fuzz.ip.user_ns["optimizer"].param_groups]
        assert all(math.isfinite(lr) and lr > 0 for lr in lrs), f"%{name} {line!r}: lrs {lrs}"
        fuzz.reset()


# Lines that succeed as they are, per magic; the fuzzer appends noise to some.
SEEDS = {
    "freeze": ["layer1", "model.layer1-2", '"*.1"', "model --except fc", "layer2 --bn frozen"],
    "unfreeze": ["layer1", "layer1-3 lr=1e-5:1e-4", "fc wd=0", "model --except stem"],
    "replace_head": ["fc 5", "auto 2", "model 4 --dropout 0.1", "model.fc 3 --dry-run"],
    "summary": ["", "model", "layer1 --depth 1", "--depth 3"],
    "fit": [
        "pairs",
        "model batch",
        "text --epochs 1",
        "table --max-steps 1",
        "pairs --accum 2",
        "train_loader --max-steps 1 --loss model",  # a TypeError on step 1
        "train_loader --max-steps 1 --loss mse",  # shapes that do not broadcast
    ],
    "lr_find": ["train_loader --steps 3", "train_loader --loss model", "train_loader --loss mse"],
    "load_model": [
        *(
            f"resnet18 --weights none --as {name}"
            for name in ("__builtins__", "len", "In", "None", "a.b", "1abc", '""', "x", "weights")
        ),
        "timm:resnet18 --weights /tmp/weights.pth",
        "timm:resnet18 --weights local-dir:/tmp/weights",
    ],
    "amp": ["", "on", "off", "on bf16"],
    "device": ["", "cpu", "auto", "check", "move"],
    "gpumem": ["", "reset", "estimate", "estimate --input-shape 1,3,6,6", "watch on"],
    "tm": ["history", "undo", "fits", "doctor", "help", "use model"],
}
noise = st.lists(st.one_of(token, key_values, numbers), max_size=2)


def _line(name: str) -> st.SearchStrategy[str]:
    seeded = st.builds(
        lambda seed, extra: " ".join([seed, *extra]).strip(),
        st.sampled_from(SEEDS.get(name, [""])),
        st.one_of(st.just([]), noise),
    )
    return st.one_of(seeded, lines)


@settings(
    max_examples=EXAMPLES,
    derandomize=not EXPLORING,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
@given(data=st.data())
def test_every_line_is_one_usage_error_or_a_success(fuzz, data):
    name = data.draw(st.sampled_from(fuzz.line_magics + [f"%%{n}" for n in fuzz.cell_magics]))
    line = data.draw(_line(name.lstrip("%")))
    if name.startswith("%%"):
        _check_line(fuzz, name[2:], line, "1 + 1")
    else:
        _check_line(fuzz, name, line, None)


def test_the_fuzzer_sees_every_magic(fuzz):
    assert {"freeze", "unfreeze", "replace_head", "summary", "fit", "amp", "device"} <= set(
        fuzz.line_magics
    )
    assert {"gpumem", "tm"} <= set(fuzz.line_magics) and "amp" in fuzz.cell_magics
