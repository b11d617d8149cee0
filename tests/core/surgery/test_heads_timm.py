"""``replace_head`` on timm models, built with ``pretrained=False`` (nothing is downloaded).

Each case replaces the head through a script-mode :class:`torchmagic.Session` with an
optimizer from timm's own factory (decay / no-decay groups), trains one step and undoes.
The expected head paths are written out by hand from timm's model code (what
``get_classifier()`` returns), not derived from torchmagic, so a detection mistake fails.
Inputs are small: ``img_size`` where the model takes it, narrow widths where a family's
smallest variant is still large; the real small variants are marked slow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchmagic import Session, TorchMagicError

timm = pytest.importorskip("timm")
from timm.optim import create_optimizer_v2  # noqa: E402

NUM_CLASSES = 7


@dataclass(frozen=True)
class Case:
    arch: str
    size: int  # side of the (2, 3, size, size) input
    heads: tuple[str, ...]  # qualified names of every layer replaced, main head first
    kwargs: dict = field(default_factory=dict)


# Heads from timm/models/*.py: ResNet, DLA, Inception v3, legacy Xception: fc (DLA's is a
# 1x1 Conv2d); ResNetV2: head.fc (1x1 Conv2d); EfficientNet, MobileNetV3, GhostNet:
# classifier; ConvNeXt, RegNet, Swin, MaxViT/CoAtNet, Xception41, ByobNet (RepVGG),
# EdgeNeXt: head.fc; ViT, DeiT, EVA, BEiT: head; distilled DeiT: head + head_dist; LeViT:
# head.linear + head_dist.linear (NormLinear: BatchNorm1d, Dropout, Linear).
TINY_VIT = {"img_size": 32, "embed_dim": 32, "depth": 2, "num_heads": 2}
CASES = {
    "resnet10t": Case("resnet10t", 32, ("fc",)),
    "resnetv2_18": Case("resnetv2_18", 32, ("head.fc",)),
    "efficientnet": Case("test_efficientnet", 32, ("classifier",)),
    "mobilenetv3_small_050": Case("mobilenetv3_small_050", 32, ("classifier",)),
    "convnext_atto": Case("convnext_atto", 32, ("head.fc",)),
    "regnetx_002": Case("regnetx_002", 32, ("head.fc",)),
    "vit_tiny": Case("vit_tiny_patch16_224", 32, ("head",), {"img_size": 32}),
    "deit_tiny": Case("deit_tiny_patch16_224", 32, ("head",), {"img_size": 32}),
    "deit_tiny_distilled": Case(
        "deit_tiny_distilled_patch16_224", 32, ("head", "head_dist"), {"img_size": 32}
    ),
    "swin": Case(
        "swin_tiny_patch4_window7_224",
        32,
        ("head.fc",),
        {
            "img_size": 32,
            "window_size": 2,
            "embed_dim": 24,
            "depths": (1, 1, 2, 1),
            "num_heads": (1, 1, 1, 1),
        },
    ),
    "levit_128s": Case("levit_128s", 64, ("head.linear", "head_dist.linear"), {"img_size": 64}),
    "maxvit": Case("test_maxvit", 64, ("head.fc",), {"img_size": 64}),
    "coatnet": Case("test_coatnet", 64, ("head.fc",), {"img_size": 64}),
    "eva02_tiny": Case(
        "eva02_tiny_patch14_224", 28, ("head",), {"img_size": 28, "num_classes": 1000}
    ),
    "beit": Case("beit_base_patch16_224", 32, ("head",), TINY_VIT),
    "dla46_c": Case("dla46_c", 32, ("fc",)),
    "inception_v3": Case("inception_v3", 75, ("fc",)),
    "xception41": Case("xception41", 32, ("head.fc",)),
    "ghostnet_050": Case("ghostnet_050", 32, ("classifier",)),
    "repvgg_a0": Case("repvgg_a0", 32, ("head.fc",)),
    "edgenext_xx_small": Case("edgenext_xx_small", 32, ("head.fc",)),
}
SLOW_CASES = {
    "swin_tiny": Case(
        "swin_tiny_patch4_window7_224", 64, ("head.fc",), {"img_size": 64, "window_size": 2}
    ),
    "maxvit_pico_rw_256": Case("maxvit_pico_rw_256", 64, ("head.fc",), {"img_size": 64}),
    "coatnet_nano_rw_224": Case("coatnet_nano_rw_224", 64, ("head.fc",), {"img_size": 64}),
    "legacy_xception": Case("legacy_xception", 71, ("fc",)),
    "levit_conv_128s": Case(
        "levit_conv_128s", 64, ("head.linear", "head_dist.linear"), {"img_size": 64}
    ),
}
PARAMS = [pytest.param(n, c, id=n) for n, c in CASES.items()] + [
    pytest.param(n, c, id=n, marks=pytest.mark.slow) for n, c in SLOW_CASES.items()
]


@pytest.fixture(autouse=True)
def _one_thread():
    """Many small kernels: OpenMP threads spin-waiting on a shared machine cost more."""
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(case: Case) -> nn.Module:
    return timm.create_model(case.arch, pretrained=False, **case.kwargs)


def in_optimizer(opt: torch.optim.Optimizer, param: nn.Parameter) -> bool:
    return any(p is param for g in opt.param_groups for p in g["params"])


def classifiers(model: nn.Module) -> tuple[nn.Module, ...]:
    declared = model.get_classifier()
    return declared if isinstance(declared, tuple) else (declared,)


@pytest.mark.parametrize(("name", "case"), PARAMS)
def test_replace_head_auto(name: str, case: Case) -> None:
    model = build(case)
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    old = {path: model.get_submodule(path) for path in case.heads}
    modules_before = dict(model.named_modules())
    assert model.num_classes == 1000

    session = Session(model, opt)
    change = session.replace_head("auto", NUM_CLASSES)

    assert change.effect.modules == case.heads
    assert model.num_classes == NUM_CLASSES
    for path, was in old.items():
        head = model.get_submodule(path)
        assert head is not was and isinstance(head, nn.Conv2d) == isinstance(was, nn.Conv2d)
        assert head.weight.shape[:2] == (NUM_CLASSES, was.weight.shape[1])
        assert not any(in_optimizer(opt, p) for p in was.parameters())
        assert all(in_optimizer(opt, p) for p in head.parameters())
    # timm's own view agrees: get_classifier() (its pooling kept around it) ends in the new heads
    ends = [m if isinstance(m, (nn.Linear, nn.Conv2d)) else m.linear for m in classifiers(model)]
    assert [id(m) for m in ends] == [id(model.get_submodule(p)) for p in case.heads]
    now = dict(model.named_modules())
    for key, module in modules_before.items():
        if not any(key == p or key.startswith(p + ".") for p in case.heads):
            assert now[key] is module, key

    model.train()
    out = model(torch.randn(2, 3, case.size, case.size))
    assert out.shape == (2, NUM_CLASSES)
    new_params = [p for path in case.heads for p in model.get_submodule(path).parameters()]
    before = [p.detach().clone() for p in new_params]
    opt.zero_grad()
    F.cross_entropy(out, torch.randint(0, NUM_CLASSES, (2,))).backward()
    opt.step()
    assert all(not torch.equal(p.detach(), b) for p, b in zip(new_params, before, strict=True))

    session.undo()
    assert model.num_classes == 1000
    for path, was in old.items():
        assert model.get_submodule(path) is was
        assert all(in_optimizer(opt, p) for p in was.parameters())


@pytest.mark.parametrize("where", ["head", "head_dist", "model.head"])
def test_naming_one_distilled_head_replaces_both(where: str) -> None:
    """Distilled DeiT averages head and head_dist: one alone would break the next forward."""
    model = build(CASES["deit_tiny_distilled"])
    change = Session(model).replace_head(where, 5)
    assert set(change.effect.modules) == {"head", "head_dist"}
    assert "distillation heads replaced too: head_dist" in change.effect.notes
    assert model.head.out_features == model.head_dist.out_features == model.num_classes == 5
    assert model.eval()(torch.randn(1, 3, 32, 32)).shape == (1, 5)


def test_stage_names_work_in_the_grammar_and_freeze() -> None:
    convnext = build(CASES["convnext_atto"])
    vit = build(CASES["vit_tiny"])
    swin = build(CASES["swin"])
    for model, target, names in (
        (convnext, "stages.2-3", ("stages.2", "stages.3")),
        (vit, "blocks.8-11", ("blocks.8", "blocks.9", "blocks.10", "blocks.11")),
        (swin, "layers.0-1", ("layers.0", "layers.1")),
    ):
        opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
        change = Session(model, opt).freeze(target)
        assert change.effect.modules == names
        frozen = [p for n in names for p in model.get_submodule(n).parameters()]
        assert frozen and not any(p.requires_grad or in_optimizer(opt, p) for p in frozen)
        rest = {id(p) for p in frozen}
        assert all(p.requires_grad for p in model.parameters() if id(p) not in rest)


def test_discriminative_unfreeze_over_vit_blocks() -> None:
    model = build(CASES["vit_tiny"])
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    tm = Session(model, opt)
    tm.freeze(exclude=["head"])
    tm.replace_head("auto", NUM_CLASSES)
    tm.unfreeze("blocks.8-11", lr=(1e-5, 1e-4))
    lrs: dict[str, set[float]] = {}
    decay: dict[str, float] = {}
    for group in opt.param_groups:
        name = str(group.get("name", ""))
        if name.startswith("blocks."):
            block = name.split(" · ")[0]  # timm's decay / no-decay split survives per block
            lrs.setdefault(block, set()).add(group["lr"])
            decay[name] = group["weight_decay"]
    assert list(lrs) == ["blocks.8", "blocks.9", "blocks.10", "blocks.11"]
    assert all(len(values) == 1 for values in lrs.values())
    assert decay["blocks.8"] == 0.05 and decay["blocks.8 · no_decay"] == 0.0
    spread = [lrs[n].pop() for n in lrs]
    assert spread[0] == pytest.approx(1e-5) and spread[-1] == pytest.approx(1e-4)
    assert all(a < b for a, b in zip(spread, spread[1:], strict=False))
    out = model(torch.randn(2, 3, 32, 32))
    F.cross_entropy(out, torch.tensor([0, 1])).backward()
    opt.step()
    assert all(p.grad is not None for p in model.blocks[8].parameters())
    assert all(p.grad is None for p in model.blocks[7].parameters())


def test_non_head_is_refused_and_the_declared_heads_are_listed() -> None:
    model = build(CASES["convnext_atto"])
    with pytest.raises(TorchMagicError, match=r"'stages.3' is not a head.*head\.fc \(Linear"):
        Session(model).replace_head("stages.3", 5)
    with pytest.raises(TorchMagicError, match=r"'head.norm' is not a head: it is a LayerNorm2d"):
        Session(model).replace_head("head.norm", 5)
    assert model.head.fc.out_features == 1000 and model.num_classes == 1000


def test_headless_model_is_refused_with_the_fix() -> None:
    model = timm.create_model("resnet10t", pretrained=False, num_classes=0)
    with pytest.raises(TorchMagicError, match="built without a classifier.*num_classes="):
        Session(model).replace_head("auto", 5)
