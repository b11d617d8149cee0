"""The magics on a fresh InteractiveShell per test, asserting on the live objects."""

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from traitlets.config import Config

from cuda_fakes import cuda_initialised_after
from snapshots import assert_same, snapshot
from torchmagic.magics.extension import loaded

SETUP = """
import torch, torchvision
torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100)
model(torch.randn(2, 3, 32, 32)).sum().backward()
optimizer.step()
"""


def run(ip, source):
    ip.run_cell(source).raise_error()


def test_issue_walkthrough(ip):
    run(ip, SETUP)
    with capture_output() as cap:
        for line in (
            "%freeze model.layer1-3",
            "%replace_head fc 10",
            "%unfreeze layer4 lr=1e-4",
            "%summary",
            "%tm history",
        ):
            run(ip, line)
    assert len(cap.outputs) == 5
    assert all({"text/plain", "text/html"} <= set(o.data) for o in cap.outputs)
    ns = ip.user_ns
    model, opt = ns["model"], ns["optimizer"]
    assert model.fc.out_features == 10
    groups = {g.get("name"): g for g in opt.param_groups}
    assert groups["layer4"]["lr"] == pytest.approx(1e-4)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == {id(p) for g in opt.param_groups for p in g["params"]}
    run(
        ip,
        """
x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
w = model.layer1[0].conv1.weight.detach().clone()
loss = torch.nn.functional.cross_entropy(model(x), y)
loss.backward(); optimizer.step(); scheduler.step()
assert torch.equal(model.layer1[0].conv1.weight, w)
""",
    )
    assert "%unfreeze layer4 lr=1e-4" in cap.outputs[4].data["text/plain"]
    with capture_output() as cap:
        run(ip, "%tm undo")
    assert "layer4" not in {g.get("name") for g in opt.param_groups}
    assert "undid" in cap.outputs[0].data["text/plain"]


BAD = [
    ("%freeze layr1", "did you mean layer1"),
    ("%freeze layer3-1", "must not exceed"),
    ("%freeze layer5-6", "no module 'layer5-6'"),
    ("%freeze model.relu", "has no parameters"),
    ("%freeze notmodel.layer1", "'notmodel' is a int"),
    ("%freeze", "name what to freeze"),
    ("%freeze --bn bogus layer1", "--bn takes eval | train | frozen, got 'bogus'"),
    ("%freeze layer1 --dry-rn", "unknown option --dry-rn; did you mean --dry-run?"),
    ("%summary --depth x", "--depth takes a whole number, got 'x'"),
    ("%tm histroy", "did you mean %tm history?"),
    ("%unfreeze layer4 lr=abc", "bad value lr=abc"),
    ("%unfreeze layer4 lr=-1", "bad value lr=-1"),
    ("%unfreeze layer4 lr=1e-5:", "lr=1e-5:: a discriminative range needs both ends"),
    ("%unfreeze layer4 momentum=0.9", "unknown option 'momentum='"),
    ("%unfreeze layer4 wd=-1", "bad value wd=-1"),
    ("%replace_head fc -3", "positive integer"),
    ("%replace_head fc ten", "whole number"),
    ("%replace_head fc 10 extra", "one head and one class count, e.g. fc 10, got fc 10 extra"),
    ("%replace_head fc 10 --dropout 1.5", "--dropout"),
    ("%summary --depth -1", "--depth must be >= 0, got -1"),
    ("%tm use", "%tm use needs NAME: %tm use NAME"),
    ("%tm bogus", "unknown subcommand 'bogus' of %tm; %tm? lists them"),
    ("%tm undo now", "%tm undo takes no more words, got 'now'"),
    ("%tm history --sync", "--sync goes with %tm save"),
    ("%gpumem watch on --tracebacks", "--tracebacks goes with %gpumem reset"),
    ("%tm undo", "nothing to undo"),
    ("%freeze model.layer1 --opt nope", "--opt nope: no variable"),
]


@pytest.mark.parametrize("line, fragment", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_usage_error_and_changes_nothing(ip, line, fragment):
    run(ip, SETUP + "notmodel = 3\n")
    model, opt = ip.user_ns["model"], ip.user_ns["optimizer"]
    before = snapshot(model, opt)
    magic, _, rest = line[1:].partition(" ")
    with pytest.raises(UsageError) as info:
        ip.run_line_magic(magic, rest)
    assert type(info.value) is UsageError  # IPython hides the traceback only for this class
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert_same(before, snapshot(model, opt))


def test_no_model_anywhere(ip):
    with pytest.raises(UsageError, match="no model found"):
        ip.run_line_magic("freeze", "layer1")


def test_rerunning_the_cell_picks_up_the_new_model(ip):
    run(ip, SETUP)
    old = ip.user_ns["model"]
    run(ip, "%freeze layer1")
    # model and optimizer cells re-run (the model cell alone: tests/test_stale_optimizer.py)
    run(ip, "model = torchvision.models.resnet18(weights=None)")
    run(ip, "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)")
    run(ip, "%freeze layer2")
    new = ip.user_ns["model"]
    assert all(p.requires_grad for p in new.layer1.parameters())
    assert not any(p.requires_grad for p in new.layer2.parameters())
    assert all(p.requires_grad for p in old.layer2.parameters())


def test_config_magic_sets_bn_policy(ip):
    run(ip, SETUP)
    run(ip, '%config TorchMagics.bn_policy = "train"')
    run(ip, "%freeze layer1")
    assert not ip.user_ns["model"].layer1[0].bn1._forward_pre_hooks
    # an optimizer that never held layer1: the ratio gives its lr (else it would go home)
    run(ip, "optimizer = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)")
    run(ip, "%config TorchMagics.unfreeze_lr_ratio = 0.5")
    run(ip, "%unfreeze layer1")
    group = next(g for g in ip.user_ns["optimizer"].param_groups if g.get("name") == "layer1")
    assert group["lr"] == pytest.approx(0.5 * 1e-3, rel=1e-3)


def test_config_from_ipython_config():
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.clear_instance()
    shell = InteractiveShell.instance(
        config=Config({"TorchMagics": {"bn_policy": "frozen", "width": 60}})
    )
    try:
        shell.run_line_magic("load_ext", "torchmagic")
        shell.run_cell(SETUP).raise_error()
        with capture_output() as cap:
            shell.run_line_magic("freeze", "layer1")
        from torchvision.ops.misc import FrozenBatchNorm2d

        assert isinstance(shell.user_ns["model"].layer1[0].bn1, FrozenBatchNorm2d)
        assert max(len(x) for x in cap.outputs[0].data["text/plain"].splitlines()) <= 60
    finally:
        InteractiveShell.clear_instance()


def test_quoted_glob_except_and_dry_run(ip):
    run(ip, SETUP)
    model = ip.user_ns["model"]
    run(ip, '%freeze model "*.bn*" --dry-run')
    assert all(p.requires_grad for p in model.parameters())
    run(ip, "%freeze model --except fc")
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["fc.weight", "fc.bias"]


def test_a_trailing_comment_is_not_an_argument(ip):
    """docs/magics.md writes the Python call beside each magic as a comment
    (``%freeze model.layer1-3  # tm.freeze("layer1-3")``); a ``#`` inside a word or in
    quotes is still text, as in a shell."""
    from torchmagic.magics.base import strip_comment

    run(ip, SETUP)
    model = ip.user_ns["model"]
    run(ip, '%freeze model.layer1-3            # tm.freeze("layer1-3")')
    run(ip, "%replace_head fc 10 #ten classes")
    assert not any(p.requires_grad for p in model.layer3.parameters())
    assert model.layer4[0].conv1.weight.requires_grad and model.fc.out_features == 10
    commands = [e.command for e in loaded(ip).session.history()]
    assert commands == ["%freeze model.layer1-3", "%replace_head fc 10"]  # no comments kept
    assert strip_comment("# all of it") == ""
    assert strip_comment("auto labels=C#,F# # two") == "auto labels=C#,F# "
    assert strip_comment("model '#x' \\#y \"a #b\" c") == "model '#x' \\#y \"a #b\" c"
    assert strip_comment("layer1 'a # b") == "layer1 'a # b"  # unclosed: the split refuses it


def test_use_picks_the_current_model(ip):
    run(ip, SETUP + "other = torchvision.models.resnet18(weights=None)")
    with pytest.raises(UsageError, match="candidates: model, other"):
        ip.run_line_magic("freeze", "layer1")
    run(ip, "%tm use other")
    run(ip, "%freeze layer1")
    assert not any(p.requires_grad for p in ip.user_ns["other"].layer1.parameters())


def test_help_lists_every_magic(ip):
    with capture_output() as cap:
        run(ip, "%tm help")
    text = cap.outputs[0].data["text/plain"]
    for name in ("%freeze", "%unfreeze", "%replace_head", "%summary", "%tm"):
        assert name in text


NO_CUDA_SESSION = """
import torchmagic, torch, torchvision
assert not torch.cuda.is_initialized(), "importing torchmagic initialised CUDA"
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "torchmagic")
for cell in (
    "import torch, torchvision",
    "model = torchvision.models.resnet18(weights=None, num_classes=4)",
    "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)",  # no step: torch's own
    # graph-capture check in Adam.step initialises CUDA wherever a GPU is present
    "%freeze layer1-3",
    "%unfreeze layer3 lr=1e-4",
    "%replace_head fc 3",
    "%summary",
    "%gpumem",
    "%gpumem estimate --input-shape 2,3,32,32",
    "%gpumem watch on",
    "x = torch.ones(4)",
    "%gpumem watch off",
    "%device check",
    "%tm doctor",
    "%amp on",
    "%amp off",
    "%tm undo",
):
    ip.run_cell(cell).raise_error()
"""


def test_loading_and_using_the_extension_never_initialises_cuda():
    """In a fresh process: in this one, an earlier GPU test may have initialised CUDA."""
    assert not cuda_initialised_after(NO_CUDA_SESSION)


def test_unload_removes_the_magics(ip):
    ip.run_line_magic("unload_ext", "torchmagic")
    assert "freeze" not in ip.magics_manager.magics["line"]
    ip.run_line_magic("load_ext", "torchmagic")
    assert "freeze" in ip.magics_manager.magics["line"]
