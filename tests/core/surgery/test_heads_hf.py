"""``replace_head`` on Hugging Face transformers models built from small configs.

Nothing is downloaded: every model is built from a config object, and the hub is switched
off. Each case starts with ``num_labels=1000``, replaces the head, and trains one step with
the model's own loss (``labels=`` in the forward), an AdamW and transformers' own warmup
schedule. The expected head paths are written out by hand from transformers' model code.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from torchmagic import Session, TorchMagicError

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")

NUM_CLASSES = 5
OLD_CLASSES = 1000
VOCAB = 100


@dataclass(frozen=True)
class Case:
    build: Callable[[], nn.Module]
    heads: tuple[str, ...]  # main head first
    base: str  # attribute holding the backbone: its encoder layers are frozen / unfrozen
    has_loss: bool = True  # DeiT with a teacher head computes no loss


def hf(config: str, model: str, **kwargs) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        cfg = getattr(transformers, config)(num_labels=OLD_CLASSES, **kwargs)
        return getattr(transformers, model)(cfg)

    return build


VIT = {
    "hidden_size": 16,
    "num_hidden_layers": 12,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "image_size": 32,
    "patch_size": 8,
}
TEXT = {
    "vocab_size": VOCAB,
    "hidden_size": 16,
    "num_hidden_layers": 12,
    "num_attention_heads": 2,
    "intermediate_size": 32,
}
STAGES = {"hidden_sizes": [8, 16, 24, 32], "depths": [1, 1, 1, 1]}

# Heads from transformers/models/*/modeling_*.py: every *ForImageClassification and
# *ForSequenceClassification keeps its head in `classifier` (ResNet: Sequential(Flatten,
# Linear) -> classifier.1; RoBERTa: RobertaClassificationHead(dense, dropout, out_proj)
# -> classifier.out_proj); DeiT with a teacher: cls_classifier + distillation_classifier.
VISION = {
    "vit": Case(hf("ViTConfig", "ViTForImageClassification", **VIT), ("classifier",), "vit"),
    "deit": Case(hf("DeiTConfig", "DeiTForImageClassification", **VIT), ("classifier",), "deit"),
    "deit_distilled": Case(
        hf("DeiTConfig", "DeiTForImageClassificationWithTeacher", **VIT),
        ("cls_classifier", "distillation_classifier"),
        "deit",
        has_loss=False,
    ),
    "beit": Case(hf("BeitConfig", "BeitForImageClassification", **VIT), ("classifier",), "beit"),
    "dinov2": Case(
        hf("Dinov2Config", "Dinov2ForImageClassification", **VIT), ("classifier",), "dinov2"
    ),
    "convnext": Case(
        hf("ConvNextConfig", "ConvNextForImageClassification", **STAGES),
        ("classifier",),
        "convnext",
    ),
    "resnet": Case(
        hf("ResNetConfig", "ResNetForImageClassification", embedding_size=8, **STAGES),
        ("classifier.1",),
        "resnet",
    ),
    "swin": Case(
        hf(
            "SwinConfig",
            "SwinForImageClassification",
            image_size=32,
            patch_size=4,
            embed_dim=8,
            depths=[1, 1],
            num_heads=[1, 2],
            window_size=2,
        ),
        ("classifier",),
        "swin",
    ),
    "mobilevit": Case(
        hf(
            "MobileViTConfig",
            "MobileViTForImageClassification",
            image_size=32,
            hidden_sizes=[16, 24, 32],
            neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 48],
        ),
        ("classifier",),
        "mobilevit",
    ),
    "efficientnet": Case(
        hf(
            "EfficientNetConfig",
            "EfficientNetForImageClassification",
            image_size=32,
            width_coefficient=0.1,
            depth_coefficient=0.1,
            hidden_dim=128,
        ),
        ("classifier",),
        "efficientnet",
    ),
}
TEXT_CASES = {
    "bert": Case(
        hf("BertConfig", "BertForSequenceClassification", **TEXT), ("classifier",), "bert"
    ),
    "distilbert": Case(
        hf(
            "DistilBertConfig",
            "DistilBertForSequenceClassification",
            vocab_size=VOCAB,
            dim=16,
            n_layers=2,
            n_heads=2,
            hidden_dim=32,
        ),
        ("classifier",),
        "distilbert",
    ),
    "roberta": Case(
        hf("RobertaConfig", "RobertaForSequenceClassification", **TEXT),
        ("classifier.out_proj",),
        "roberta",
    ),
    "deberta_v2": Case(
        hf("DebertaV2Config", "DebertaV2ForSequenceClassification", **TEXT),
        ("classifier",),
        "deberta",
    ),
}
CASES = {**VISION, **TEXT_CASES}


@pytest.fixture(autouse=True)
def _offline_one_thread(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def inputs(model: nn.Module) -> dict[str, torch.Tensor]:
    if model.main_input_name == "pixel_values":
        return {"pixel_values": torch.randn(2, model.config.num_channels, 32, 32)}
    return {"input_ids": torch.randint(0, VOCAB, (2, 8))}


def encoder_layers(model: nn.Module, base: str) -> str:
    """The ModuleList of encoder layers (its name differs across families and versions)."""
    for tail in (
        "encoder.layer",
        "layers",
        "encoder.layers",
        "transformer.layer",
        "encoder.stages",
    ):
        path = f"{base}.{tail}"
        try:
            if isinstance(model.get_submodule(path), nn.ModuleList):
                return path
        except AttributeError:
            continue
    raise AssertionError(f"no encoder layers under {base}")


def in_optimizer(opt: torch.optim.Optimizer, param: nn.Parameter) -> bool:
    return any(p is param for g in opt.param_groups for p in g["params"])


def optimizer_and_schedule(model: nn.Module):
    """AdamW under transformers' linear warmup, one step into the warmup (at step 0 its
    factor is 0, which the scheduler sync refuses to place new groups on)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    schedule = transformers.get_linear_schedule_with_warmup(opt, 2, 100)
    opt.step()
    schedule.step()
    return opt, schedule


@pytest.mark.parametrize("name", list(CASES))
def test_replace_head_auto_keeps_config_in_step(name: str) -> None:
    case = CASES[name]
    model = case.build()
    opt, schedule = optimizer_and_schedule(model)
    old = {path: model.get_submodule(path) for path in case.heads}
    old_id2label = model.config.id2label
    assert model.config.num_labels == OLD_CLASSES

    session = Session(model, opt, schedulers=[schedule])
    change = session.replace_head("auto", NUM_CLASSES)

    assert change.effect.modules == case.heads
    assert model.config.num_labels == NUM_CLASSES
    assert model.config.id2label == {i: f"LABEL_{i}" for i in range(NUM_CLASSES)}
    assert model.config.label2id == {f"LABEL_{i}": i for i in range(NUM_CLASSES)}
    if hasattr(model, "num_labels"):
        assert model.num_labels == NUM_CLASSES
    for path, was in old.items():
        head = model.get_submodule(path)
        assert isinstance(head, nn.Linear) and head.out_features == NUM_CLASSES
        assert head.in_features == was.in_features
        assert not any(in_optimizer(opt, p) for p in was.parameters())
        assert all(in_optimizer(opt, p) for p in head.parameters())

    model.train()
    y = torch.tensor([0, NUM_CLASSES - 1])
    if case.has_loss:
        out = model(**inputs(model), labels=y)
        assert out.logits.shape == (2, NUM_CLASSES)
        loss = out.loss  # the model's own: it reshapes logits by num_labels
    else:
        out = model(**inputs(model))
        assert out.cls_logits.shape == out.distillation_logits.shape == (2, NUM_CLASSES)
        loss = nn.functional.cross_entropy(out.cls_logits, y) + nn.functional.cross_entropy(
            out.distillation_logits, y
        )
    new_params = [p for path in case.heads for p in model.get_submodule(path).parameters()]
    before = [p.detach().clone() for p in new_params]
    opt.zero_grad()
    loss.backward()
    opt.step()
    schedule.step()
    assert all(not torch.equal(p.detach(), b) for p, b in zip(new_params, before, strict=True))

    session.undo()
    assert model.config.id2label is old_id2label and model.config.num_labels == OLD_CLASSES
    if hasattr(model, "num_labels"):
        assert model.num_labels == OLD_CLASSES
    for path, was in old.items():
        assert model.get_submodule(path) is was


def test_labels_name_the_classes_and_undo_restores_them() -> None:
    model = TEXT_CASES["roberta"].build()
    tm = Session(model)
    change = tm.replace_head("auto", labels=["negative", "neutral", "positive"])
    assert model.classifier.out_proj.out_features == 3
    assert model.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    assert model.config.label2id == {"negative": 0, "neutral": 1, "positive": 2}
    assert any("3 labels" in n or "→ 3" in n for n in change.effect.notes)
    out = model(input_ids=torch.randint(0, VOCAB, (2, 8)), labels=torch.tensor([0, 2]))
    out.loss.backward()
    tm.undo()
    assert model.config.num_labels == OLD_CLASSES and model.num_labels == OLD_CLASSES


@pytest.mark.parametrize(
    ("labels", "num_classes", "match"),
    [
        (["a", "b"], 3, "2 labels for 3 classes"),
        (["a", "a", "b"], 3, "repeat a"),
        ("abc", 3, "list of class names"),
    ],
)
def test_bad_labels_change_nothing(labels, num_classes, match) -> None:
    model = TEXT_CASES["bert"].build()
    old_head, old_map = model.classifier, model.config.id2label
    with pytest.raises(TorchMagicError, match=match) as info:
        Session(model).replace_head("auto", num_classes, labels=labels)
    assert info.value.param == "labels"
    assert model.classifier is old_head and model.config.id2label is old_map
    assert model.num_labels == OLD_CLASSES


def test_labels_without_a_label_map_are_kept_by_the_session() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    session = Session(model)
    session.replace_head("auto", 2, labels=["a", "b"])
    assert model[2].out_features == 2 and session.labels() == ("a", "b")
    assert not hasattr(model, "config")


@pytest.mark.parametrize("where", ["cls_classifier", "distillation_classifier"])
def test_naming_one_deit_head_replaces_both(where: str) -> None:
    model = VISION["deit_distilled"].build()
    change = Session(model).replace_head(where, NUM_CLASSES)
    assert set(change.effect.modules) == {"cls_classifier", "distillation_classifier"}
    assert model.eval()(**inputs(model)).logits.shape == (2, NUM_CLASSES)


@pytest.mark.parametrize(
    ("name", "where", "why"),
    [
        ("distilbert", "pre_classifier", "Linear 16→16 whose output is not"),
        ("bert", "bert.pooler", "bert.pooler.dense"),
        ("roberta", "classifier.dense", "Linear 16→16 whose output is not"),
    ],
)
def test_backbone_layers_are_refused(name: str, where: str, why: str) -> None:
    model = CASES[name].build()
    before = [id(m) for m in model.modules()]
    with pytest.raises(TorchMagicError, match="is not a head") as info:
        Session(model).replace_head(where, NUM_CLASSES)
    assert why in str(info.value)
    assert "Heads of " in str(info.value) and CASES[name].heads[0] in str(info.value)
    assert [id(m) for m in model.modules()] == before
    assert model.config.num_labels == OLD_CLASSES


@pytest.mark.parametrize("name", ["vit", "bert"])
def test_freeze_and_discriminative_unfreeze_over_encoder_layers(name: str) -> None:
    case = CASES[name]
    model = case.build()
    opt, schedule = optimizer_and_schedule(model)
    tm = Session(model, opt, schedulers=[schedule])
    layers = encoder_layers(model, case.base)
    embeddings = f"{case.base}.embeddings"
    frozen = tm.freeze(f"{layers}.0-5", embeddings)
    assert frozen.effect.modules == (embeddings, *(f"{layers}.{i}" for i in range(6)))
    for path in frozen.effect.modules:
        params = list(model.get_submodule(path).parameters())
        assert params and not any(p.requires_grad or in_optimizer(opt, p) for p in params)

    tm.replace_head("auto", NUM_CLASSES)
    tm.unfreeze(f"{layers}.3-5", lr=(1e-5, 1e-4))
    lrs = {g["name"]: g["lr"] for g in opt.param_groups if "name" in g}
    spread = [lrs[f"{layers}.{i}"] for i in (3, 4, 5)]
    # geometric, x10 from first to last (the absolute values follow the warmup factor)
    assert [lr / spread[0] for lr in spread] == pytest.approx([1, 10**0.5, 10])
    assert len(schedule.base_lrs) == len(opt.param_groups)

    out = model(**inputs(model), labels=torch.tensor([0, 1]))
    out.loss.backward()
    opt.step()
    schedule.step()
    assert all(p.grad is not None for p in model.get_submodule(f"{layers}.3").parameters())
    assert all(p.grad is None for p in model.get_submodule(f"{layers}.2").parameters())
    assert all(p.grad is None for p in model.get_submodule(embeddings).parameters())


@pytest.mark.parametrize("name", ["bert", "vit", "dinov2"])
def test_summary_stays_bounded(name: str) -> None:
    model = CASES[name].build()
    report = Session(model).summary()
    assert 0 < len(report.rows) <= 60
    assert report.counts.total == sum(p.numel() for p in model.parameters())
