"""The code examples of docs/*.md still run (README.md's run in one kernel, in order, in
test_readme.py).

The fenced ```python blocks are read from the markdown, so the documents stay the source;
nothing here copies a snippet. Each block runs in a fresh IPython shell with torchmagic
loaded (a block that loads it itself, ``%load_ext torchmagic``, gets a shell without it)
after PREAMBLE, which binds the names the examples use:

- a block of magic lines (every line that is not a comment starts with ``%``) runs one
  magic line at a time, in order, in the one shell, so a failure names its line; comment
  lines below a magic (``#   tm.fit(...)``) belong to it;
- any other block is one cell (IPython reads the ``%`` lines inside it);
- a block headed ``# ipython_config.py`` is a config file: it runs with ``c`` a traitlets
  ``Config``, and a shell built with that config loads the extension with those values;
- the Python call docs/magics.md writes beside a magic (``# tm.freeze("layer1-3")``) runs
  in a second fresh shell in the magic's place, on ``torchmagic.notebook_session()``.

Every example must run without an error; a ``UsageError`` a magic prints counts as one
(no example in the documents shows an error). The exceptions are the small tables below,
each keyed by a fragment of exactly one example (its line in a block of magic lines, else
its block) that must still be in the documents, each with its reason: SKIP (cannot run
here), SETUP (code a reader would have run first), SLOW (marked ``slow``), SHOWS_OUTPUT
(the document prints the example's output: it must match), OFFLINE (a spelling that
would download weights, and its offline equivalent).
"""

from __future__ import annotations

import ast
import atexit
import re
import time
from dataclasses import dataclass

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from traitlets.config import Config

from paths import ROOT
from shells import fresh_shell

DOCS = tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))

# The names the examples use: a resnet18 with random weights (never a download), its
# AdamW and a cosine schedule, small loaders of random 16×16 images in 10 classes, one
# batch `x`, `y` and a loss. Small inputs keep %fit and %lr_find to a second or two.
PREAMBLE = """
import torch, torchvision, torchmagic
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
def _images(n): return TensorDataset(torch.randn(n, 3, 16, 16), torch.randint(0, 10, (n,)))
train_loader = DataLoader(_images(8), batch_size=4, shuffle=True)
val_loader = DataLoader(_images(4), batch_size=4)
loader = train_loader
x, y = next(iter(train_loader))
criterion = nn.CrossEntropyLoss()
"""

# Examples that cannot run on this machine (no GPU, no internet), each with its reason.
SKIP = {
    # Builds resnet18 with its DEFAULT weights: a download. Offline the magic refuses in
    # one line naming --weights none (tests/test_load_model.py checks that line).
    "%load_model resnet18 --num-classes 10": "downloads resnet18's DEFAULT weights",
    # fp16 autocast is refused on the CPU by design (tests/test_amp.py); it needs CUDA.
    # The magic and its Python call are skipped; %amp off after it still runs.
    'tm.amp_on("fp16")': "fp16 autocast needs a CUDA device",
    # FSDP2 needs the process group and device mesh torchrun's ranks make; the path runs
    # on two gloo ranks in tests/test_fsdp_resume.py (slow).
    "shard=shard)   # every rank": "fully_shard needs torchrun's process group",
    "report = tm.shard(shard)": "fully_shard needs torchrun's process group",
    # An 8B language model's weights (a download) on GPUs; the same commands run on a
    # 70B-shaped model on the meta device in tests/test_lora_meta.py.
    '"meta-llama/Llama-3.1-8B"': "downloads an 8B model and spreads it over GPUs",
}

# Code a reader would have run before the example, each with why.
SETUP = {
    # %predict reads image files and a PIL image through evaluation transforms.
    "photos/cat.jpg": """
import os
from PIL import Image
from torchvision import transforms
os.makedirs("photos", exist_ok=True)
for _name in ("cat", "dog"):
    Image.new("RGB", (20, 20), (120, 60, 30)).save(f"photos/{_name}.jpg")
image = Image.open("photos/cat.jpg")
preprocess = transforms.Compose([transforms.Resize(16), transforms.ToTensor()])
""",
    # Linear probing trains the head alone: the backbone is frozen first (--cache-features
    # refuses otherwise), which the progressive run on the next line unfreezes again.
    "--cache-features": "%freeze model --except fc",
    # Accelerate's prepare needs an Accelerator (on the CPU here).
    "accelerator.prepare": """
from accelerate import Accelerator
accelerator = Accelerator(cpu=True)
""",
    # The user's own training object holding a model and an optimizer as attributes.
    "learner.model.layer1-3": """
class Learner: pass
learner = Learner()
learner.model = torchvision.models.resnet18(weights=None)
learner.opt = torch.optim.SGD(learner.model.parameters(), lr=0.1)
""",
    # A folder of class folders, as a user keeps their images (a few generated PNGs).
    'tm.load_data("images/")': """
import numpy as _np
from pathlib import Path as _Path
from PIL import Image as _Image
for _k, _name in enumerate(("ants", "bees")):
    (_Path("images") / _name).mkdir(parents=True, exist_ok=True)
    for _i in range(5):
        _pixels = _np.full((12, 12, 3), 40 * _i + _k, _np.uint8)
        _Image.fromarray(_pixels).save(f"images/{_name}/{_i}.png")
""",
    # %tm undo needs a command to undo, and %tm use another model variable.
    "%tm history": """
%freeze layer1
other = torchvision.models.resnet18(weights=None)
""",
}

# A file %tm save wrote in the notebook (the examples run in a temporary folder).
SAVED = """
_tm = torchmagic.Session(model, optimizer, schedulers=[scheduler])
_tm.freeze("layer1-3"); _tm.replace_head("fc", 10)
_tm.save("run.pt")
model = torchvision.models.resnet18(weights=None)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
"""
# An export for inference needs the model's input: %load_model's weights or a timm model's
# pretrained_cfg tell it; the random resnet18 here says it as a timm model would.
KNOWN_INPUT = """
model.pretrained_cfg = {"input_size": (3, 32, 32)}
net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 4))
net.pretrained_cfg = {"input_size": (3, 32, 32)}
%tm use model
"""
SETUP['tm.export("model.pt2"): the model for inference'] = KNOWN_INPUT
SETUP['tm.export("model.pt2"): the current model'] = KNOWN_INPUT
# Reading exported files back: the files a notebook wrote, with class names.
SETUP['torch.export.load("model.pt2"'] = (
    KNOWN_INPUT
    + """
%replace_head fc labels=ant,bee,wasp
%tm export model.pt2 --force
%tm export model.safetensors --force
%tm export model.onnx --force
"""
)
SETUP['torchmagic.resume("run.pt", model, optimizer, schedulers=[scheduler])'] = SAVED
SETUP["%tm load run.pt"] = SAVED

# Examples that take over a few seconds on two CPU cores: marked slow (`make test-all`).
SLOW = {
    # Two lr range tests of up to 100 AdamW steps of resnet18 each (about 20 s).
    "%lr_find train_loader --apply": "two lr range tests",
    # An lr range test and a 3-epoch %fit under bf16 (about 10 s).
    "found = tm.lr_find(": "an lr range test and a fit",
    # %gpumem batch measures real training steps of resnet18 on 224×224 inputs (4-6 s).
    "%gpumem batch --input-shape 3,224,224": "real steps at 224×224",
}

# Examples whose output the document prints in the next fenced block without a language:
# the text of the example's last output must be that block, line for line.
SHOWS_OUTPUT = {
    # docs/output.md's session: "this is the text form of the last one" (%unfreeze).
    "%unfreeze layer4 lr=1e-4\n": "docs/output.md's first session",
}

# Spellings that download weights, with what runs offline instead: the same model, with
# random weights in place of the downloaded ones.
OFFLINE = {'weights="DEFAULT"': "weights=None"}


@dataclass(frozen=True)
class Example:
    """One runnable piece of a block: a magic line (with its comment lines), or a block."""

    doc: str
    line: int  # 1-based, in the document
    code: str


CALL = re.compile(r"\b(?:tm|torchmagic)\.\w")


def is_expression(text: str) -> bool:
    try:
        ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    return True


def python_beside(example: Example) -> list[str]:
    """The Python a magic's comments give for it (``# tm.freeze("layer1-3")``, ``#   tm.fit(
    ...)``): in each comment, the longest expression from the first ``tm.`` or
    ``torchmagic.`` on (``tm.devices(): cpu, ...`` gives ``tm.devices()``)."""
    calls = []
    for line in example.code.splitlines():
        comment = line[line.index("#") :] if "#" in line else ""
        match = CALL.search(comment)
        if match is not None:
            text = comment[match.start() :]
            calls.append(
                next(text[:end] for end in range(len(text), 0, -1) if is_expression(text[:end]))
            )
    return calls


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # the opening fence's line
    code: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def config_file(self) -> bool:
        return self.code.startswith("# ipython_config.py")

    @property
    def magic_lines(self) -> bool:
        lines = [line for line in self.code.splitlines() if line.strip()]
        code = [line for line in lines if not line.lstrip().startswith("#")]
        return bool(code) and all(line.startswith("%") and line[1:2] != "%" for line in code)

    def examples(self) -> list[Example]:
        if not self.magic_lines:
            return [Example(self.doc, self.line + 1, self.code)]
        examples: list[Example] = []
        for number, line in enumerate(self.code.splitlines(), self.line + 1):
            if line.startswith("%"):
                examples.append(Example(self.doc, number, line))
            elif examples:
                previous = examples[-1]
                examples[-1] = Example(previous.doc, previous.line, f"{previous.code}\n{line}")
        return examples


FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)


def blocks(lang: str = "python") -> list[Block]:
    """The fenced blocks of the documents in ``lang``, in document order."""
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match["lang"].strip() == lang:
                line = text.count("\n", 0, match.start()) + 1
                found.append(Block(doc, line, match["code"]))
    return found


BLOCKS = blocks()


def matching(fragment: str) -> list[Example]:
    return [e for b in BLOCKS for e in b.examples() if fragment in e.code]


@pytest.mark.parametrize(
    "table",
    [SKIP, SETUP, SLOW, SHOWS_OUTPUT, OFFLINE],
    ids=["skip", "setup", "slow", "shows-output", "offline"],
)
def test_every_listed_fragment_names_one_example(table):
    """A fragment whose example was edited away (or that now matches several) is stale."""
    for fragment in table:
        assert len(matching(fragment)) == 1, (fragment, matching(fragment))


def test_the_documents_have_their_examples():
    """The parser finds the blocks (a change of fence style would otherwise pass quietly)."""
    per_doc = {doc: sum(b.doc == doc for b in BLOCKS) for doc in DOCS}
    assert per_doc["docs/output.md"] >= 1 and per_doc["docs/magics.md"] >= 15, per_doc


def run(ip: InteractiveShell, code: str, where: str) -> str:
    """Run ``code`` as a cell; any error (a ``UsageError`` included) fails the test. The
    text form of the cell's last output (``text/plain``) is returned."""
    with capture_output() as out:
        result = ip.run_cell(code)
    if not result.success:
        error = result.error_before_exec or result.error_in_exec
        pytest.fail(f"{where}\n{code}\n-> {type(error).__name__}: {error}\n{out.stdout[-2000:]}")
    return out.outputs[-1].data.get("text/plain", "") if out.outputs else ""


def offline(code: str) -> str:
    for download, local in OFFLINE.items():
        code = code.replace(download, local)
    return code


def setup_for(example: Example) -> str | None:
    return next((code for fragment, code in SETUP.items() if fragment in example.code), None)


def skipped(example: Example) -> str | None:
    return next((why for fragment, why in SKIP.items() if fragment in example.code), None)


def param(block: Block) -> object:
    slow = any(fragment in block.code for fragment in SLOW)
    return pytest.param(block, id=block.id, marks=[pytest.mark.slow] if slow else [])


@pytest.fixture(autouse=True)
def _in_a_temporary_folder(tmp_path, monkeypatch):
    """Examples write files (``%tm save run.pt``): never into the repository."""
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("block", [param(b) for b in BLOCKS if not b.config_file])
def test_example_block_runs(block: Block):
    examples = block.examples()
    reasons = [why for why in map(skipped, examples) if why]
    if len(reasons) == len(examples):
        pytest.skip("; ".join(reasons))
    with fresh_shell(load="%load_ext torchmagic" not in block.code) as ip:
        run(ip, PREAMBLE, "PREAMBLE")
        for example in examples:
            if skipped(example):
                continue
            where = f"{example.doc}:{example.line}"
            setup = setup_for(example)
            if setup is not None:
                run(ip, setup, f"SETUP for {where}")
            started = time.perf_counter()
            shown = run(ip, offline(example.code), where)
            print(f"{where}: {time.perf_counter() - started:.2f} s")
    if any(fragment in block.code for fragment in SHOWS_OUTPUT):
        printed = next(b for b in blocks("") if b.doc == block.doc and b.line > block.line)
        assert lines(shown) == lines(printed.code), f"{printed.id} is not what {block.id} shows"


def lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines()]


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.config_file], ids=lambda b: b.id)
def test_config_file_block_configures_the_extension(block: Block):
    config = Config()
    exec(block.code, {"c": config})  # the documentation's own example
    expected = {name: dict(values) for name, values in config.items()}  # IPython adds to it
    assert expected
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance(config=config)
    try:
        ip.run_line_magic("load_ext", "torchmagic")
        for name, values in expected.items():
            configurable = next(c for c in ip.configurables if type(c).__name__ == name)
            for trait, value in values.items():
                assert getattr(configurable, trait) == value, (name, trait)
    finally:
        InteractiveShell.clear_instance()
        atexit.unregister(ip.atexit_operations)


@pytest.mark.parametrize(
    "block", [param(b) for b in BLOCKS if b.magic_lines and any(map(python_beside, b.examples()))]
)
def test_python_beside_each_magic_runs(block: Block):
    """docs/magics.md gives the Session call beside each magic. In a fresh shell, after the
    same PREAMBLE and SETUP, those calls run in the magics' place, on the session the
    magics drive (``tm = torchmagic.notebook_session()``)."""
    examples = [e for e in block.examples() if not skipped(e)]
    if not any(map(python_beside, examples)):
        pytest.skip("no Python beside these magics")
    with fresh_shell(load=True) as ip:
        run(ip, PREAMBLE + "tm = torchmagic.notebook_session()\n", "PREAMBLE")
        for example in examples:
            where = f"{example.doc}:{example.line}"
            setup = setup_for(example)
            if setup is not None:
                run(ip, setup, f"SETUP for {where}")
            for call in python_beside(example):
                run(ip, call, where)
