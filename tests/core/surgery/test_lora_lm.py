"""``%lora`` where language models are: GPT-2's ``Conv1D`` through peft's layer, peft's
target spelling (``q_proj,v_proj``, ``c_attn``, a list), DoRA and rsLoRA, and peft's own
trainable count; each compared bit for bit with ``get_peft_model`` on a twin built from
the same seed and trained by the same hand loop."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from torch import nn

from builders import IDS, gpt2, llama
from torchmagic import Session
from torchmagic.core.integrations import peft as peft_integration

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 3) -> None:
    """The same hand loop on both twins: next-token loss, backward, step."""
    for _ in range(steps):
        model(input_ids=IDS, labels=IDS).loss.backward()
        opt.step()
        opt.zero_grad()


def logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def ours(build, targets, **options) -> tuple[nn.Module, torch.optim.Optimizer, Session]:
    """``%freeze`` then ``%lora`` on a fresh model whose optimizer held everything."""
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tm = Session(model, opt)
    tm.freeze()
    torch.manual_seed(1)
    tm.lora(targets, r=4, **options)
    return model, opt, tm


def theirs(build, targets: list[str], **options) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The same adapters by hand: peft's own ``get_peft_model`` and an AdamW over what trains."""
    model = build()
    torch.manual_seed(1)
    config = peft.LoraConfig(r=4, lora_alpha=16, target_modules=targets, **options)
    wrapped = peft.get_peft_model(model, config)
    opt = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-3)
    return wrapped, opt


def same_weights(model: nn.Module, peft_model: nn.Module) -> None:
    mine = model.state_dict()
    other = peft_model.base_model.model.state_dict()
    assert mine.keys() == other.keys()
    for key, value in mine.items():
        assert torch.equal(value, other[key]), key


CASES = [
    ("gpt2 c_attn", gpt2, "c_attn", ["c_attn"], {}),
    ("gpt2 list", gpt2, ["c_attn", "c_proj"], ["c_attn", "c_proj"], {}),
    ("gpt2 dora+rslora", gpt2, "c_attn", ["c_attn"], {"use_dora": True, "use_rslora": True}),
    ("llama q,v", llama, "q_proj,v_proj", ["q_proj", "v_proj"], {}),
    ("llama dora", llama, "q_proj,v_proj", ["q_proj", "v_proj"], {"use_dora": True}),
    ("llama rslora", llama, ["q_proj", "v_proj"], ["q_proj", "v_proj"], {"use_rslora": True}),
    ("llama bf16", lambda: llama().to(torch.bfloat16), "q_proj,v_proj", ["q_proj", "v_proj"], {}),
]


@pytest.mark.parametrize(
    ("build", "targets", "peft_targets", "options"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_adapters_train_merge_and_undo_as_peft_does(build, targets, peft_targets, options):
    model, opt, tm = ours(build, targets, **options)
    twin, twin_opt = theirs(build, peft_targets, **options)
    fresh_keys = list(build().state_dict())
    adapted = [n for n, m in model.named_modules() if peft_integration.is_lora_layer(m)]
    assert adapted == [
        n
        for n, m in twin.base_model.model.named_modules()
        if m is not None and peft_integration.is_lora_layer(m)
    ]
    # peft's count, and what %summary shows
    trainable, total = twin.get_nb_trainable_parameters()
    counts = tm.summary().counts
    assert (counts.trainable, counts.total) == (trainable, total)
    same_weights(model, twin)
    assert {p.dtype for p in peft_integration.adapters_of(model)} == {torch.float32}
    train(model, opt)
    train(twin, twin_opt)
    same_weights(model, twin)
    assert torch.equal(logits(model), logits(twin))
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    tm.merge_lora()
    merged = twin.merge_and_unload()
    assert list(model.state_dict()) == fresh_keys
    kinds = {n: type(m) for n, m in merged.named_modules()}
    assert {n: type(m) for n, m in model.named_modules()} == kinds
    for key, value in merged.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    assert torch.equal(logits(model), logits(merged))
    tm.undo()
    assert [n for n, m in model.named_modules() if peft_integration.is_lora_layer(m)] == adapted
    for key, value in model.state_dict().items():
        assert torch.equal(value, trained[key]), key
    lora_group = opt.param_groups[-1]
    assert {id(p) for p in lora_group["params"]} == {
        id(p) for p in peft_integration.adapters_of(model)
    }


def test_gpt2_conv1d_is_adapted_through_peft_linear_with_fan_in_fan_out():
    model, _, tm = ours(gpt2, "transformer.h.0.attn.c_attn")
    layer = model.transformer.h[0].attn.c_attn
    assert type(layer).__name__ == "Linear" and layer.fan_in_fan_out
    assert type(peft_integration.base_of(layer)).__name__ == "Conv1D"
    assert not peft_integration.is_lora_layer(model.transformer.h[1].attn.c_attn)
    tm.merge_lora()
    conv = model.transformer.h[0].attn.c_attn
    assert type(conv) is transformers.pytorch_utils.Conv1D


def test_suffixes_match_path_endings_and_a_list_is_the_same_call():
    model, opt, _ = ours(llama, "q_proj,v_proj")
    listed, listed_opt, _ = ours(llama, ["q_proj", "v_proj"])
    names = [n for n, m in model.named_modules() if peft_integration.is_lora_layer(m)]
    assert names == [
        f"model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in ("q_proj", "v_proj")
    ]
    assert [n for n, m in listed.named_modules() if peft_integration.is_lora_layer(m)] == names
    for (n, a), (_, b) in zip(model.named_parameters(), listed.named_parameters(), strict=True):
        assert torch.equal(a, b) and a.requires_grad == b.requires_grad, n
    # a dotted ending: the path's last components
    dotted, _, _ = ours(llama, "self_attn.k_proj")
    assert [n for n, m in dotted.named_modules() if peft_integration.is_lora_layer(m)] == [
        "model.layers.0.self_attn.k_proj",
        "model.layers.1.self_attn.k_proj",
    ]


@pytest.mark.parametrize(
    ("targets", "match"),
    [
        ("q_proj,v_prj", "no module path ends with 'v_prj'; did you mean v_proj"),
        ("q_prj", "no module path ends with 'q_prj'; did you mean q_proj"),
        ("q_proj,,v_proj", "is not a module name"),
        (["q_proj", 3], "a list of targets holds module names"),
    ],
)
def test_a_name_that_matches_nothing_is_refused_with_the_suffix_form(targets, match):
    model = llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train(model, opt, steps=1)
    before = [(n, p.detach().clone(), p.requires_grad) for n, p in model.named_parameters()]
    groups = [[id(p) for p in g["params"]] for g in opt.param_groups]
    tm = Session(model, opt)
    with pytest.raises(ValueError, match=match):
        tm.lora(targets)
    after = [(n, p, p.requires_grad) for n, p in model.named_parameters()]
    assert [(n, g) for n, _, g in after] == [(n, g) for n, _, g in before]
    assert all(torch.equal(a, b) for (_, a, _), (_, b, _) in zip(after, before, strict=True))
    assert [[id(p) for p in g["params"]] for g in opt.param_groups] == groups
    assert not tm.history()


def test_a_save_of_peft_spelled_adapters_resumes_bit_for_bit(tmp_path):
    import torchmagic

    def built():
        model = llama()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    model, opt = built()
    tm = Session(model, opt)
    tm.freeze()
    tm.lora("q_proj,v_proj", r=4, use_dora=True)
    tm.lora(["o_proj"], r=2)
    train(model, opt, steps=1)
    tm.save(tmp_path / "run.pt")
    fresh, fresh_opt = built()
    torchmagic.resume(tmp_path / "run.pt", fresh, fresh_opt)
    train(model, opt, steps=1)
    train(fresh, fresh_opt, steps=1)
    live = dict(model.named_parameters())
    assert [n for n, _ in fresh.named_parameters()] == list(live)
    for name, p in fresh.named_parameters():
        assert torch.equal(p, live[name]) and p.requires_grad == live[name].requires_grad, name


def test_magics_take_peft_spelling_dora_and_rslora(ip):
    model = gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ip.user_ns.update(model=model, opt=opt)
    ip.run_line_magic("freeze", "model")
    ip.run_line_magic("lora", "c_attn r=4 --dora --rslora")
    layer = model.transformer.h[1].attn.c_attn
    assert layer.use_dora["default"] and layer.use_rslora["default"]
    assert layer.scaling["default"] == 16 / 4**0.5
    ip.run_line_magic("lora", "c_fc,mlp.c_proj r=2")
    assert peft_integration.rank(model.transformer.h[0].mlp.c_proj) == 2
    assert not peft_integration.is_lora_layer(model.transformer.h[0].attn.c_proj)
    before = [(n, p.requires_grad) for n, p in model.named_parameters()]
    for line in ("c_atn", "c_fc,nothing", "attn.c_proj --dora=1"):
        with pytest.raises(UsageError) as refused:
            ip.run_line_magic("lora", line)
        assert "\n" not in str(refused.value)
    assert [(n, p.requires_grad) for n, p in model.named_parameters()] == before
    ip.run_line_magic("tm", "undo")
    ip.run_line_magic("tm", "undo")
    assert not peft_integration.lora_layers(model)


def test_a_bitsandbytes_layer_is_refused_and_nothing_changes():
    class Linear4bit(nn.Linear):  # bitsandbytes' class, by the package it comes from
        pass

    Linear4bit.__module__ = "bitsandbytes.nn.modules"
    model = llama()
    attention = model.model.layers[1].self_attn
    attention.v_proj = Linear4bit(32, 16, bias=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tm = Session(model, opt)
    flags = [p.requires_grad for p in model.parameters()]
    with pytest.raises(ValueError, match="layers.1.self_attn.v_proj is a bitsandbytes Linear4bit"):
        tm.lora("q_proj,v_proj")
    assert not peft_integration.lora_layers(model) and type(attention.v_proj) is Linear4bit
    assert [p.requires_grad for p in model.parameters()] == flags and not tm.history()
