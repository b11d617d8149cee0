"""``replace_head("auto", n)`` on every torchvision classification family, end to end.

Each case builds the model (``weights=None``: nothing is downloaded), replaces the head
through a script-mode :class:`torchmagic.Session`, checks the live objects (the module at
the head path, the optimizer's param groups by identity), trains one step and undoes.

The expected head paths are written out by hand from torchvision's model code, not
derived from ``torchmagic.core.surgery.heads``, so a detection mistake shows up as a failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from torchmagic import Session, TorchMagicError

NUM_CLASSES = 7


@dataclass(frozen=True)
class Case:
    """One model: how to build it, what input it takes, where its heads are."""

    build: Callable[[], nn.Module]
    size: int  # square input side for a (2, 3, size, size) batch in train mode
    head: str  # qualified name of the main head layer
    aux: tuple[str, ...] = ()  # auxiliary classifiers replaced along with it
    kind: type[nn.Module] = nn.Linear


def tv(name: str, **kwargs) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        return getattr(torchvision.models, name)(weights=None, **kwargs)

    return build


def user_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 16), nn.ReLU(), nn.Linear(16, 10))


# Head paths from torchvision/models/*.py:
#   ResNet / ResNeXt / Wide ResNet / RegNet / ShuffleNetV2 / GoogLeNet / Inception3: self.fc
#   VGG, AlexNet: classifier = Sequential(..., Linear(4096, num_classes)) -> classifier.6
#   MobileNetV2, EfficientNet, MNASNet: classifier = Sequential(Dropout, Linear) -> .1
#   MobileNetV3: classifier = Sequential(Linear, Hardswish, Dropout, Linear) -> .3
#   SqueezeNet: classifier = Sequential(Dropout, final_conv (Conv2d 1x1), ReLU, Pool) -> .1
#   ConvNeXt: classifier = Sequential(LayerNorm2d, Flatten, Linear) -> .2
#   DenseNet: classifier is the Linear itself
#   VisionTransformer: heads = Sequential(OrderedDict(head=Linear)) -> heads.head
#   SwinTransformer (v1, v2): self.head
#   MaxVit: classifier = Sequential(Pool, Flatten, LayerNorm, Linear, Tanh, Linear) -> .5
#   GoogLeNet aux: aux1.fc2, aux2.fc2; Inception3 aux: AuxLogits.fc
# Input sides are small ones each model accepts in train mode: most take 32
# (AlexNet 63); ViT-B/16 as built checks for 224, Inception v3 needs 299 for its aux
# branch, MaxViT 224 for its 7x7 partitions.
CASES: dict[str, Case] = {
    "resnet18": Case(tv("resnet18"), 32, "fc"),
    "resnet50": Case(tv("resnet50"), 32, "fc"),
    "resnext50_32x4d": Case(tv("resnext50_32x4d"), 32, "fc"),
    "wide_resnet50_2": Case(tv("wide_resnet50_2"), 32, "fc"),
    "regnet_y_400mf": Case(tv("regnet_y_400mf"), 32, "fc"),
    "regnet_x_400mf": Case(tv("regnet_x_400mf"), 32, "fc"),
    "shufflenet_v2_x0_5": Case(tv("shufflenet_v2_x0_5"), 32, "fc"),
    "googlenet": Case(
        tv("googlenet", aux_logits=True, init_weights=False), 32, "fc", ("aux1.fc2", "aux2.fc2")
    ),
    "inception_v3": Case(
        tv("inception_v3", aux_logits=True, init_weights=False), 299, "fc", ("AuxLogits.fc",)
    ),
    "vgg11": Case(tv("vgg11", init_weights=False), 32, "classifier.6"),
    "vgg11_bn": Case(tv("vgg11_bn", init_weights=False), 32, "classifier.6"),
    "alexnet": Case(tv("alexnet"), 63, "classifier.6"),
    "mobilenet_v2": Case(tv("mobilenet_v2"), 32, "classifier.1"),
    "mobilenet_v3_small": Case(tv("mobilenet_v3_small"), 32, "classifier.3"),
    "mobilenet_v3_large": Case(tv("mobilenet_v3_large"), 32, "classifier.3"),
    "efficientnet_b0": Case(tv("efficientnet_b0"), 32, "classifier.1"),
    "efficientnet_v2_s": Case(tv("efficientnet_v2_s"), 32, "classifier.1"),
    "mnasnet0_5": Case(tv("mnasnet0_5"), 32, "classifier.1"),
    "squeezenet1_0": Case(tv("squeezenet1_0"), 32, "classifier.1", kind=nn.Conv2d),
    "squeezenet1_1": Case(tv("squeezenet1_1"), 32, "classifier.1", kind=nn.Conv2d),
    "convnext_tiny": Case(tv("convnext_tiny"), 32, "classifier.2"),
    "densenet121": Case(tv("densenet121"), 32, "classifier"),
    "vit_b_16": Case(tv("vit_b_16"), 224, "heads.head"),
    "swin_t": Case(tv("swin_t"), 32, "head"),
    "swin_v2_t": Case(tv("swin_v2_t"), 32, "head"),
    "maxvit_t": Case(tv("maxvit_t"), 224, "classifier.5"),
    "user_sequential": Case(user_mlp, 4, "3"),
}


def io_features(module: nn.Module) -> tuple[int, int]:
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    assert isinstance(module, nn.Conv2d)
    return module.in_channels, module.out_channels


def group_params(opt: torch.optim.Optimizer) -> list[list[nn.Parameter]]:
    return [list(g["params"]) for g in opt.param_groups]


def occurrences(opt: torch.optim.Optimizer, param: nn.Parameter) -> int:
    """In how many param groups ``param`` appears (by identity)."""
    return sum(any(p is param for p in g["params"]) for g in opt.param_groups)


def assert_same_groups(opt: torch.optim.Optimizer, before: list[list[nn.Parameter]]) -> None:
    after = group_params(opt)
    assert len(after) == len(before)
    for now, then in zip(after, before, strict=True):
        assert len(now) == len(then)
        assert all(a is b for a, b in zip(now, then, strict=True))


def logits_of(output) -> list[torch.Tensor]:
    """Main output first, then any auxiliary outputs (GoogLeNetOutputs, InceptionOutputs)."""
    if isinstance(output, torch.Tensor):
        return [output]
    assert isinstance(output, tuple), type(output)
    return [t for t in output if t is not None]


@pytest.fixture(scope="module", autouse=True)
def _environment(tmp_path_factory):
    """A scratch TORCH_HOME (nothing is ever downloaded or read from the user's cache) and
    one intra-op thread: these are many small kernels, and on a shared 2-core machine
    OpenMP threads spin-waiting on each other made the file ~8x slower."""
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCH_HOME", str(tmp_path_factory.mktemp("torch-home")))
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)


@pytest.mark.parametrize("name", list(CASES))
def test_replace_head_auto(name: str) -> None:
    case = CASES[name]
    model = case.build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    paths = (case.head, *case.aux)

    old = {path: model.get_submodule(path) for path in paths}
    for path, module in old.items():
        assert type(module) is case.kind, (path, type(module))
        if name != "user_sequential":
            assert io_features(module)[1] == 1000, path  # torchvision's default num_classes
    old_params = [p for m in old.values() for p in m.parameters()]
    groups_before = group_params(opt)
    modules_before = dict(model.named_modules())

    session = Session(model, opt)
    change = session.replace_head("auto", NUM_CLASSES)

    assert set(change.effect.modules) == set(paths)
    new = {path: model.get_submodule(path) for path in paths}
    for path in paths:
        head, was = new[path], old[path]
        assert head is not was
        assert type(head) is type(was), path
        assert io_features(head) == (io_features(was)[0], NUM_CLASSES), path
        assert head.weight.dtype == was.weight.dtype and head.weight.device == was.weight.device
        assert (head.bias is None) == (was.bias is None), path
        if isinstance(head, nn.Conv2d):
            assert head.kernel_size == was.kernel_size and head.stride == was.stride
    # nothing but the heads moved
    now = dict(model.named_modules())
    for key, module in modules_before.items():
        if not any(key == p or key.startswith(p + ".") for p in paths):
            assert now[key] is module, key

    # optimizer: old head params gone (by identity), new ones in exactly one group
    for p in old_params:
        assert occurrences(opt, p) == 0
        assert p not in opt.state
    new_params = [p for m in new.values() for p in m.parameters()]
    assert new_params
    for p in new_params:
        assert occurrences(opt, p) == 1
    old_ids = {id(p) for p in old_params}
    rest = [p for p in model.parameters() if id(p) not in {id(q) for q in new_params}]
    assert all(occurrences(opt, p) == 1 for p in rest)
    assert not old_ids & {id(p) for p in rest}

    # one training step reaches the new heads
    model.train()
    with torch.no_grad():
        before = [p.detach().clone() for p in new_params]
    x = torch.randn(2, 3, case.size, case.size)
    y = torch.randint(0, NUM_CLASSES, (2,))
    outputs = logits_of(model(x))
    assert len(outputs) == len(paths)  # the aux heads are really used in train mode
    for out in outputs:
        assert out.shape == (2, NUM_CLASSES)
    loss = sum(F.cross_entropy(out, y) for out in outputs)
    opt.zero_grad()
    loss.backward()
    opt.step()
    for p, was in zip(new_params, before, strict=True):
        assert p.grad is not None
        assert not torch.equal(p.detach(), was)
    assert all(any(p is q for q in opt.state) for p in new_params)

    # undo: the very same head objects and group lists as before the command
    session.undo()
    for path in paths:
        assert model.get_submodule(path) is old[path]
    assert_same_groups(opt, groups_before)
    live = {id(p) for g in opt.param_groups for p in g["params"]}
    assert all(id(p) in live for p in opt.state)  # no state left for the dropped heads
    now = dict(model.named_modules())
    assert now.keys() == modules_before.keys()
    assert all(now[k] is modules_before[k] for k in modules_before)


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("resnet18", "fc"),
        ("resnet18", "model.fc"),
        ("mobilenet_v3_small", "model.classifier.3"),
        ("mobilenet_v3_small", "classifier"),  # a sub-tree: its last Linear
    ],
)
def test_replace_head_explicit_path(name: str, where: str) -> None:
    case = CASES[name]
    model = case.build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    old = model.get_submodule(case.head)
    groups_before = group_params(opt)

    session = Session(model, opt)
    change = session.replace_head(where, NUM_CLASSES)

    assert change.effect.modules == (case.head,)
    head = model.get_submodule(case.head)
    assert head is not old
    assert io_features(head) == (io_features(old)[0], NUM_CLASSES)
    assert all(occurrences(opt, p) == 0 for p in old.parameters())
    assert all(occurrences(opt, p) == 1 for p in head.parameters())
    session.undo()
    assert model.get_submodule(case.head) is old
    assert_same_groups(opt, groups_before)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_replace_head_keeps_dtype(dtype: torch.dtype) -> None:
    model = user_mlp().to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    Session(model, opt).replace_head("auto", NUM_CLASSES)
    head = model[3]
    assert isinstance(head, nn.Linear) and head.out_features == NUM_CLASSES
    assert head.weight.dtype == dtype and head.bias.dtype == dtype
    assert model(torch.randn(2, 3, 4, 4, dtype=dtype)).shape == (2, NUM_CLASSES)


class Encoder(nn.Module):
    """No conventional head name, and the last parametrised layer is a LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3)
        self.mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
        self.proj = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).mean((2, 3))
        return self.norm(self.proj(self.mlp(x)))


def test_unknown_architecture_is_refused_and_nothing_changes() -> None:
    model = Encoder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()  # some momentum state, to check it is left alone
    modules_before = dict(model.named_modules())
    groups_before = group_params(opt)
    state_before = {p: {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    requires_before = [p.requires_grad for p in model.parameters()]

    session = Session(model, opt)
    with pytest.raises(TorchMagicError) as info:
        session.replace_head("auto", NUM_CLASSES)
    message = str(info.value)
    for candidate in ("mlp.0", "mlp.2", "proj"):
        assert candidate in message, message
    assert "norm" not in message

    now = dict(model.named_modules())
    assert now.keys() == modules_before.keys()
    assert all(now[k] is modules_before[k] for k in modules_before)
    assert_same_groups(opt, groups_before)
    assert {id(p) for p in opt.state} == {id(p) for p in state_before}
    for p, saved in state_before.items():
        assert all(torch.equal(opt.state[p][k], v) for k, v in saved.items())
    assert [p.requires_grad for p in model.parameters()] == requires_before
    assert session.history() == ()
    with pytest.raises(TorchMagicError):
        session.undo()
