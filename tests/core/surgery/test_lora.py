"""``%lora`` / ``tm.lora``: peft's LoRA layers put into the live model in place, the
adapters in one new ``lora`` group under the base-lr rule, the targeted base weights out
of the optimizer (state set aside), merge, off/on, undo bit for bit; on timm and Hugging
Face ViTs, BERT, a torchvision convnet and a model that is already a PeftModel."""

from __future__ import annotations

import pytest
import torch
import torchvision
from IPython.core.error import UsageError
from torch import nn

from builders import text_loaders, tiny_bert
from completions import complete
from torchmagic import Session
from torchmagic.core.integrations import peft as peft_integration
from torchmagic.core.surgery.optimizer_sync import group_index
from torchmagic.core.tensors import state_bytes

peft = pytest.importorskip("peft")
timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

X = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def vit(num_classes: int = 5) -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=32, depth=2, pretrained=False, num_classes=num_classes
    ).eval()


def stepped(model: nn.Module, lr: float = 1e-3, steps: int = 1) -> torch.optim.Optimizer:
    """AdamW over what trains, after ``steps`` real steps (so there is state to keep)."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        model(X).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    return opt


def snapshot(model: nn.Module, opt: torch.optim.Optimizer | None) -> dict:
    """Everything %lora may change, compared bit for bit."""
    return {
        "modules": [(n, id(m), type(m)) for n, m in model.named_modules()],
        "params": [
            (n, id(p), p.requires_grad, p.detach().clone()) for n, p in model.named_parameters()
        ],
        "groups": None
        if opt is None
        else [([id(p) for p in g["params"]], g["lr"], g.get("name")) for g in opt.param_groups],
        "state": None
        if opt is None
        else {
            id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
            for p, s in opt.state.items()
        },
    }


def same(a: dict, b: dict) -> bool:
    def eq(x, y) -> bool:
        if torch.is_tensor(x):
            return torch.equal(x, y)
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(eq(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return len(x) == len(y) and all(eq(i, j) for i, j in zip(x, y, strict=True))
        return x == y

    return eq(a, b)


def adapters(model: nn.Module) -> list[nn.Parameter]:
    return peft_integration.adapters_of(model)


def test_adding_keeps_outputs_and_changes_only_the_targeted_layers():
    model = vit()
    opt = stepped(model)
    before = snapshot(model, opt)
    y0 = model(X)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    tm = Session(model, opt)
    qkvs = [p for b in model.blocks for p in b.attn.qkv.parameters()]
    set_aside = state_bytes(opt, qkvs)
    change = tm.lora("blocks.*.attn.qkv", r=4, lr=1e-4)
    assert change.effect.modules == ("blocks.0.attn.qkv", "blocks.1.attn.qkv")
    assert tm.history_bytes() == set_aside  # the adapters live in the model, not the log
    assert torch.equal(model(X), y0)
    qkv = model.blocks[0].attn.qkv
    assert peft_integration.is_lora_layer(qkv) and peft_integration.rank(qkv) == 4
    for name, p in model.named_parameters():
        if ".base_layer." in name:
            assert not p.requires_grad
        elif "lora_" in name:
            assert p.requires_grad
        else:
            assert p.requires_grad == flags[name], name
    lora_group = opt.param_groups[-1]
    assert lora_group["name"] == "lora" and lora_group["lr"] == 1e-4
    assert [id(p) for p in lora_group["params"]] == [id(p) for p in adapters(model)]
    held = group_index(opt)
    bases = [p for b in model.blocks for p in b.attn.qkv.base_layer.parameters()]
    assert not any(id(p) in held for p in bases)
    assert not any(p in opt.state for p in bases)  # set aside
    tm.undo()
    assert not peft_integration.is_lora_layer(model.blocks[0].attn.qkv)
    assert same(snapshot(model, opt), before)


def test_three_steps_move_only_adapters_and_head_then_merge_and_undo():
    model = vit()
    tm = Session(namespace={"model": model})
    tm.freeze("model", exclude=["head"])
    opt = stepped(model)
    tm.workspace.namespace["opt"] = opt
    tm.lora("blocks.*.attn.qkv", "blocks.*.mlp.fc1", r=4)
    names_before = [n for n, _ in vit().named_parameters()]
    kept = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    b_before = model.blocks[1].mlp.fc1.lora_B["default"].weight.detach().clone()
    model.train()
    for _ in range(3):
        model(X).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    for n, p in model.named_parameters():
        if "lora_" not in n and not n.startswith("head."):
            assert torch.equal(p, kept[n]), n
    assert not torch.equal(model.blocks[1].mlp.fc1.lora_B["default"].weight, b_before)
    assert not torch.equal(model.head.weight, kept["head.weight"])
    trained = model(X).detach()
    before_merge = snapshot(model, opt)
    tm.merge_lora()
    assert [n for n, _ in model.named_parameters()] == names_before
    assert type(model.blocks[0].attn.qkv) is nn.Linear
    assert torch.allclose(model(X), trained, rtol=1e-4, atol=1e-4 * trained.abs().max().item())
    assert not model.blocks[0].attn.qkv.weight.requires_grad  # frozen before %lora
    lora_group = next(g for g in opt.param_groups if g.get("name") == "lora")
    assert lora_group["params"] == []  # kept, emptied
    tm.undo()
    assert same(snapshot(model, opt), before_merge)
    assert torch.equal(model(X), trained)


def test_merge_gives_trainable_layers_back_to_their_home_group():
    model = vit()
    opt = stepped(model)
    home = opt.param_groups[0]
    weight = model.blocks[0].mlp.fc2.weight
    tm = Session(model, opt)
    tm.lora("blocks.0.mlp.fc2", r=2)
    assert all(p is not weight for p in home["params"])
    tm.merge_lora()
    assert model.blocks[0].mlp.fc2.weight is weight and weight.requires_grad
    assert any(p is weight for p in home["params"])


def test_off_and_on_switch_the_adapters_only():
    model = vit()
    opt = stepped(model)
    y0 = model(X)
    tm = Session(model, opt)
    tm.lora("blocks.*.attn.qkv", r=4, lr=1e-2)
    model.train()
    for _ in range(2):
        model(X).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        on = model(X)
        base = snapshot(model, opt)
        tm.lora_off()
        off = model(X)
        assert not torch.equal(on, off)
        flags = [p.requires_grad for p in adapters(model)]
        assert all(flags)  # still trainable, still in the optimizer
        tm.lora_on()
        assert torch.equal(model(X), on)
        tm.undo()
        assert torch.equal(model(X), off)
        tm.undo()
        assert same(snapshot(model, opt), base)
    assert y0.shape == on.shape


def test_scheduler_keeps_the_base_lr_ratio():
    model = vit()
    opt = stepped(model, lr=1e-3)
    sched = transformers.get_linear_schedule_with_warmup(opt, 3, 20)
    for _ in range(2):
        opt.step()
        sched.step()
    tm = Session(namespace={"model": model, "opt": opt, "sched": sched})
    tm.lora("blocks.1.attn.qkv", r=2, lr=1e-4)
    lora_index = len(opt.param_groups) - 1
    for _ in range(6):
        opt.step()
        sched.step()
        ratio = opt.param_groups[lora_index]["lr"] / opt.param_groups[0]["lr"]
        assert ratio == pytest.approx(0.1, rel=1e-9)
    assert sched.base_lrs[lora_index] == 1e-4
    assert opt.param_groups[lora_index]["initial_lr"] == 1e-4


def test_default_lr_is_the_head_groups_base_lr():
    model = vit()
    opt = stepped(model, lr=3e-3)
    Session(model, opt).lora("blocks.0.attn.qkv")
    assert opt.param_groups[-1]["lr"] == 3e-3
    assert opt.param_groups[-1]["weight_decay"] == opt.defaults["weight_decay"]


@pytest.mark.parametrize(
    ("targets", "options", "match"),
    [
        (("blocks.0.norm1",), {}, "LayerNorm: LoRA adapts Linear, Conv1D, Conv2d or Embedding"),
        (("*.nothing",), {}, "matches no module"),
        (("blocks.0.attn.qkv",), {"r": 0}, "r must be a positive integer"),
        (("blocks.0.attn.qkv",), {"alpha": -1}, "alpha must be"),
        (("blocks.0.attn.qkv",), {"dropout": 1.0}, "dropout must be in"),
        (("pos_drop",), {}, "Dropout: LoRA adapts"),
    ],
)
def test_bad_calls_change_nothing(targets, options, match):
    model = vit()
    opt = stepped(model)
    before = snapshot(model, opt)
    tm = Session(model, opt)
    with pytest.raises(ValueError, match=match):
        tm.lora(*targets, **options)
    assert same(snapshot(model, opt), before) and not tm.history()


def test_an_adapted_layer_twice_and_merge_without_adapters_are_refused():
    model = vit()
    tm = Session(model, stepped(model))
    tm.lora("blocks.0.attn.qkv", "blocks.0.attn.proj")
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        tm.lora("blocks.0.attn.qkv")
    with pytest.raises(ValueError, match="no Linear, Conv1D, Conv2d or Embedding outside LoRA"):
        tm.lora("blocks.0.attn")
    tm.undo()
    with pytest.raises(ValueError, match="has no LoRA adapters"):
        tm.merge_lora()


def test_dry_run_changes_nothing():
    model = vit()
    opt = stepped(model)
    before = snapshot(model, opt)
    change = Session(model, opt).lora("blocks.*.attn.qkv", dry_run=True)
    assert change.dry_run and change.after.trainable < change.before.trainable
    assert same(snapshot(model, opt), before)


def test_summary_marks_adapted_layers_and_counts_adapters():
    model = vit()
    tm = Session(model, stepped(model))
    tm.lora("blocks.*.attn.qkv", r=8)
    report = tm.summary("blocks.0", depth=2)
    rows = {r.name.rpartition(".")[2]: r for r in report.rows}
    assert rows["qkv"].lora_rank == 8 and rows["proj"].lora_rank == 0
    full = tm.summary()
    assert full.adapter_params == sum(p.numel() for p in adapters(model))
    assert full.counts.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_memory_shows_the_saving_against_full_fine_tuning():
    model = vit()
    tm = Session(model, stepped(model))
    assert tm.estimate().full_finetune_state is None
    tm.lora("blocks.*.attn.qkv", r=4)
    est = tm.estimate()
    base = sum(p.numel() * p.element_size() for p in model.parameters()) - sum(
        p.numel() * p.element_size() for p in adapters(model)
    )
    assert est.full_finetune_state == 2 * base + 4 * (len(list(model.parameters())) - 4)
    assert est.optimizer_state is not None and est.optimizer_state < est.full_finetune_state
    assert tm.memory().full_finetune_state == est.full_finetune_state


def test_torchvision_convnet_layer4_convs():
    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None, num_classes=4).eval()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(2, 3, 32, 32)
    y0 = net(x)
    bn = net.layer4[0].bn1.weight
    change = Session(net, opt).lora("layer4", r=2)
    convs = [
        n
        for n, m in torchvision.models.resnet18().layer4.named_modules()
        if isinstance(m, nn.Conv2d)
    ]
    assert change.effect.modules == tuple(f"layer4.{n}" for n in convs)
    assert all(peft_integration.is_lora_layer(net.get_submodule(f"layer4.{n}")) for n in convs)
    assert bn.requires_grad and torch.equal(net(x), y0)
    with torch.no_grad():
        for p in peft_integration.adapters_of(net):
            p.normal_(0, 0.01)
    adapted = net(x)
    tm = Session(net, opt)
    tm.merge_lora()
    assert all(type(net.get_submodule(f"layer4.{n}")) is nn.Conv2d for n in convs)
    assert torch.allclose(net(x), adapted, rtol=1e-4, atol=1e-4 * adapted.abs().max().item())
    assert net.layer4[0].conv1.weight.requires_grad  # it trained before %lora


def test_hugging_face_vit_attention_projections():
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=3,
    )
    model = transformers.ViTForImageClassification(config).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    y0 = model(pixel_values=X).logits
    change = Session(model, opt).lora("*.q_proj", "*.v_proj", r=4)  # query, value
    assert len(change.effect.modules) == 4
    assert torch.equal(model(pixel_values=X).logits, y0)
    attention = model.vit.layers[0].attention
    assert not attention.q_proj.base_layer.weight.requires_grad
    assert attention.k_proj.weight.requires_grad


def test_a_peft_model_gets_more_adapters():
    base = vit()
    model = peft.get_peft_model(
        base, peft.LoraConfig(r=4, target_modules=["qkv"], modules_to_save=["head"])
    )
    opt = stepped(model)
    y0 = model(X)
    tm = Session(namespace={"model": model, "opt": opt})
    tm.lora("blocks.*.mlp.fc1", r=2)
    fc1 = base.blocks[0].mlp.fc1
    assert peft_integration.is_lora_layer(fc1) and fc1.active_adapters == ["default"]
    assert torch.equal(model(X), y0)
    trainable, total = model.get_nb_trainable_parameters()
    assert tm.summary().counts.trainable == trainable
    with model.disable_adapter():  # peft's switch covers the new layers too
        assert not any(peft_integration.enabled(m) for _, m in peft_integration.lora_layers(base))
    tm.undo()
    assert not peft_integration.is_lora_layer(base.blocks[0].mlp.fc1)


def test_fit_trains_bert_adapters_on_dict_batches():
    model = tiny_bert(dropout=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tm = Session(model, opt)
    tm.freeze("model", exclude=["classifier"])
    tm.lora("*.query", "*.value", r=4, lr=1e-2)
    query = model.bert.encoder.layer[0].attention.self.query
    base = query.base_layer.weight.detach().clone()
    b = query.lora_B["default"].weight.detach().clone()
    train, val = text_loaders()
    history = tm.fit(train, val=val, epochs=1)
    assert history.steps > 0
    assert torch.equal(query.base_layer.weight, base)
    assert not torch.equal(query.lora_B["default"].weight, b)


def test_magics(ip):
    model = vit()
    opt = stepped(model)
    before = snapshot(model, opt)
    ip.user_ns.update(model=model, opt=opt)
    ip.run_line_magic("lora", '"blocks.*.attn.qkv" r=8 alpha=16 lr=1e-4')
    assert peft_integration.rank(model.blocks[1].attn.qkv) == 8
    assert opt.param_groups[-1]["name"] == "lora"
    ip.run_line_magic("lora", "off")
    assert not peft_integration.enabled(model.blocks[0].attn.qkv)
    ip.run_line_magic("lora", "on")
    ip.run_line_magic("lora", "merge")
    assert type(model.blocks[0].attn.qkv) is nn.Linear
    ip.run_line_magic("summary", "--depth 1")
    for line in ("blocks.0.norm1", "blocks.0.attn.qkv r=0", "merge", "blocks.0.attn.qkv wd=1"):
        with pytest.raises(UsageError):
            ip.run_line_magic("lora", line)
    for _ in range(4):
        ip.run_line_magic("tm", "undo")
    assert same(snapshot(model, opt), before)


def test_tab_completion_offers_subcommands_targets_and_options(ip):
    ip.user_ns["model"] = vit()
    assert {"merge", "off", "on", "blocks"} <= set(complete(ip, "%lora "))
    assert "blocks.0.attn.qkv" in complete(ip, "%lora blocks.0.attn.q")
    assert "r=" in complete(ip, "%lora blocks.0.attn.qkv r")
    assert complete(ip, "%lora merge ") == ["model"]


def test_bert_embeddings_are_adapted_and_merged_back():
    model = tiny_bert(dropout=0.0).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    y0 = model(input_ids=ids).logits
    names = [n for n, _ in model.named_parameters()]
    tm = Session(model, opt)
    tm.lora("bert.embeddings.word_embeddings", r=4, lr=1e-2)
    layer = model.bert.embeddings.word_embeddings
    assert peft_integration.is_lora_layer(layer) and torch.equal(model(input_ids=ids).logits, y0)
    model.train()
    for _ in range(2):
        model(input_ids=ids).logits.logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    trained = model(input_ids=ids).logits.detach()
    tm.merge_lora()
    assert type(model.bert.embeddings.word_embeddings) is nn.Embedding
    assert [n for n, _ in model.named_parameters()] == names
    assert torch.allclose(model(input_ids=ids).logits, trained, atol=1e-5)


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 2) -> None:
    for _ in range(steps):
        model(X).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("merged", [False, True], ids=["adapters", "merged"])
def test_a_save_carries_the_adapters_and_resumes_bit_for_bit(tmp_path, merged):
    import torchmagic

    def built():
        model = vit()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    model, opt = built()
    tm = Session(model, opt)
    tm.freeze("model", exclude=["head"])
    tm.lora("blocks.*.attn.qkv", r=4, lr=2e-3)
    _train(model, opt)
    if merged:
        tm.merge_lora()
    tm.save(tmp_path / "run.pt")
    saved = torch.load(tmp_path / "run.pt", weights_only=True)
    assert [a["path"] for a in saved["model"]["adapters"]] == (
        [] if merged else ["blocks.0.attn.qkv", "blocks.1.attn.qkv"]
    )
    fresh, fresh_opt = built()
    torchmagic.resume(tmp_path / "run.pt", fresh, fresh_opt)
    assert [n for n, _ in fresh.named_parameters()] == [n for n, _ in model.named_parameters()]
    _train(model, opt)
    _train(fresh, fresh_opt)
    live = dict(model.named_parameters())
    for name, p in fresh.named_parameters():
        assert p.requires_grad == live[name].requires_grad, name
        assert torch.equal(p, live[name]), name
    assert [g.get("name") for g in fresh_opt.param_groups] == [
        g.get("name") for g in opt.param_groups
    ]


def test_an_ema_copy_gets_the_same_adapters_and_merges_with_the_model():
    from torch.optim.swa_utils import AveragedModel

    model = vit()
    ema = AveragedModel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tm = Session(namespace={"model": model, "ema": ema, "opt": opt})
    change = tm.lora("blocks.*.attn.qkv", r=4)
    assert any("`ema`" in n for n in change.effect.notes)
    names = [n for n, _ in model.named_parameters()]
    assert [n for n, _ in ema.module.named_parameters()] == names
    for (_, mine), (_, theirs) in zip(
        ema.module.named_parameters(), model.named_parameters(), strict=True
    ):
        assert torch.equal(mine, theirs)
    _train(model, opt)
    ema.update_parameters(model)  # the first update copies; it crashed on the new names before
    ema.update_parameters(model)
    assert torch.equal(
        ema.module.blocks[0].attn.qkv.lora_B.default.weight,
        model.blocks[0].attn.qkv.lora_B.default.weight,
    )
    tm.merge_lora()
    assert isinstance(ema.module.blocks[0].attn.qkv, nn.Linear)
    assert [n for n, _ in ema.module.named_parameters()] == [n for n, _ in model.named_parameters()]
    tm.undo()  # the merge, in both
    tm.undo()  # the adapters, in both
    assert isinstance(ema.module.blocks[0].attn.qkv, nn.Linear)
    assert [n for n, _ in ema.module.named_parameters()] == [n for n, _ in vit().named_parameters()]


def test_a_grouped_convolution_is_refused_in_one_line_unless_its_groups_divide_the_rank():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3, groups=4), nn.Flatten(), nn.Linear(8 * 4 * 4, 2)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()
    before = snapshot(model, opt)
    tm = Session(model, opt)
    with pytest.raises(ValueError) as refused:
        tm.lora("1", r=2)
    message = str(refused.value)
    assert "\n" not in message and "groups=4" in message and "r=4" in message
    assert same(snapshot(model, opt), before) and not tm.history()
    # the rank peft accepts: the same layer as peft builds it by hand
    tm.lora("1", r=4)
    assert type(model[1]).__name__ == "Conv2d" and model[1].lora_A["default"].weight.shape[0] == 4
