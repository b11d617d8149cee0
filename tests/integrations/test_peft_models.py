"""A PeftModel is seen through like DDP and ``torch.compile``: targets are relative to the
base model (``blocks.3``; ``base_model.model.blocks.3`` too), the summary is the base
model's with the adapters inside it and peft's own trainable count, and ``replace_head``
finds the head peft trains as a ``modules_to_save`` copy (its frozen original follows)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torchvision
from IPython.core.error import UsageError

from builders import tiny_bert
from torchmagic import Session
from torchmagic.core.modules import unwrap

peft = pytest.importorskip("peft")
timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")


def peft_vit(modules_to_save=("head",)):
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", img_size=32, pretrained=False, num_classes=10)
    config = peft.LoraConfig(r=4, target_modules=["qkv"], modules_to_save=list(modules_to_save))
    model = peft.get_peft_model(vit, config)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    return vit, model, opt


def peft_bert():
    bert = tiny_bert()
    lora = peft.LoraConfig(r=4, target_modules=["query", "value"], task_type="SEQ_CLS")
    return bert, peft.get_peft_model(bert, lora)


def test_unwrap_reaches_the_base_model():
    vit, model, _ = peft_vit()
    assert unwrap(model) is vit
    assert unwrap(model.base_model) is vit


def test_unfreeze_names_blocks_relative_to_the_base_model():
    vit, model, opt = peft_vit()
    tm = Session(namespace={"model": model, "opt": opt})
    tm.unfreeze("blocks.3", lr=1e-5)
    tm.unfreeze("base_model.model.blocks.4", lr=1e-5)
    tm.unfreeze("model.base_model.model.blocks.5.mlp.*")
    for block in (3, 4):
        assert all(p.requires_grad for p in vit.blocks[block].parameters())
        mine = [g for g in opt.param_groups if g.get("name", "").startswith(f"blocks.{block}")]
        assert {id(p) for g in mine for p in g["params"]} == {
            id(p) for p in vit.blocks[block].parameters()
        }
        assert {g["lr"] for g in mine} == {1e-5}
    assert all(p.requires_grad for p in vit.blocks[5].mlp.parameters())
    assert not vit.blocks[6].attn.qkv.base_layer.weight.requires_grad


def test_undo_restores_peft_trainability():
    vit, model, opt = peft_vit()
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    groups = [list(g["params"]) for g in opt.param_groups]
    tm = Session(namespace={"model": model, "opt": opt})
    tm.unfreeze("blocks.3", lr=1e-5)
    tm.undo()
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before
    assert [list(g["params"]) for g in opt.param_groups][: len(groups)] == groups
    assert all(not g["params"] for g in opt.param_groups[len(groups) :])


def test_summary_is_the_base_models_with_peft_counts():
    vit, model, opt = peft_vit()
    tm = Session(namespace={"model": model, "opt": opt})
    report = tm.summary(depth=2)
    assert report.model_kind == "VisionTransformer"
    assert "blocks.3" in [r.name for r in report.rows]
    assert (report.counts.trainable, report.counts.total) == model.get_nb_trainable_parameters()
    deep = tm.summary("blocks.0.attn.qkv", depth=2)
    rows = {r.name.rpartition("qkv.")[2]: r for r in deep.rows}
    assert rows["lora_A"].state == "trainable" and rows["base_layer"].state == "frozen"
    bert, peft_model = peft_bert()
    counts = Session(namespace={"bert": peft_model}).summary().counts
    assert (counts.trainable, counts.total) == peft_model.get_nb_trainable_parameters()


def test_replace_head_replaces_the_trained_copy_and_its_frozen_original():
    vit, model, opt = peft_vit()
    x = torch.randn(2, 3, 32, 32)
    old_copy = vit.head.modules_to_save["default"]
    old_original = vit.head.original_module
    tm = Session(namespace={"model": model, "opt": opt})
    change = tm.replace_head("auto", 5)
    assert change.effect.modules == ("head.modules_to_save.default",)
    new = vit.head.modules_to_save["default"]
    assert new.out_features == 5 and all(p.requires_grad for p in new.parameters())
    assert vit.head.original_module.out_features == 5
    assert not any(p.requires_grad for p in vit.head.original_module.parameters())
    assert torch.equal(vit.head.original_module.weight, new.weight)
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    assert {id(p) for p in new.parameters()} <= held
    assert not {id(p) for p in old_copy.parameters()} & held
    assert model(x).shape == (2, 5)
    with model.disable_adapter():
        assert model(x).shape == (2, 5)
    tm.undo()
    assert vit.head.modules_to_save["default"] is old_copy
    assert vit.head.original_module is old_original
    assert {id(p) for p in old_copy.parameters()} <= {
        id(p) for g in opt.param_groups for p in g["params"]
    }
    assert model(x).shape == (2, 10)


def test_replace_head_on_peft_wrapped_bert_and_resnet():
    bert, model = peft_bert()
    tm = Session(namespace={"bert": model})
    tm.replace_head(None, 5)
    assert bert.classifier.modules_to_save["default"].out_features == 5
    assert bert.config.num_labels == 5
    ids = torch.randint(0, 50, (2, 7))
    assert model(input_ids=ids).logits.shape == (2, 5)
    torch.manual_seed(0)
    resnet = torchvision.models.resnet18(weights=None, num_classes=10)
    wrapped = peft.get_peft_model(
        resnet, peft.LoraConfig(r=4, target_modules=["conv1"], modules_to_save=["fc"])
    )
    change = Session(namespace={"net": wrapped}).replace_head(None, 4)
    assert change.effect.modules == ("fc.modules_to_save.default",)
    assert wrapped.eval()(torch.randn(1, 3, 32, 32)).shape == (1, 4)


def test_magics_see_through_a_peft_model(ip):
    vit, model, opt = peft_vit()
    ip.user_ns.update(model=model, opt=opt)
    ip.run_line_magic("unfreeze", "blocks.3 lr=1e-5")
    assert all(p.requires_grad for p in vit.blocks[3].parameters())
    ip.run_line_magic("summary", "--depth 2")
    with pytest.raises(UsageError, match="no module .99. in blocks"):
        ip.run_line_magic("freeze", "blocks.99")


def test_load_ext_does_not_import_peft():
    code = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "InteractiveShell.instance().run_line_magic('load_ext', 'torchmagic')\n"
        "print('peft' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False")
