"""Odd models: tied weights, a BatchNorm used twice, BatchNorm without
running statistics, lazy modules, TorchScript, LBFGS, hooks on a replaced head."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError


class TiedLM(nn.Module):
    """A language model whose decoder shares the embedding's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Linear(4, 4)
        self.decoder = nn.Linear(4, 10)
        self.decoder.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.body(self.embed(x)))


def _held(opt: torch.optim.Optimizer, p: torch.Tensor) -> bool:
    return any(q is p for g in opt.param_groups for q in g["params"])


def _tied():
    torch.manual_seed(0)
    model = TiedLM()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def test_replacing_a_tied_head_keeps_the_shared_weight_training():
    model, opt = _tied()
    shared = model.embed.weight
    change = Session(model, opt).replace_head("decoder", 5)
    assert model.decoder.out_features == 5 and model.embed.weight is shared
    assert _held(opt, shared) and shared.requires_grad  # the embedding still trains it
    assert _held(opt, model.decoder.weight) and model.decoder.weight is not shared
    assert any("decoder.weight is tied to embed.weight" in n for n in change.effect.notes)


def test_freezing_a_tied_module_leaves_the_shared_weight_and_says_so():
    model, opt = _tied()
    change = Session(model, opt).freeze("decoder")
    assert not model.decoder.bias.requires_grad and not _held(opt, model.decoder.bias)
    assert model.embed.weight.requires_grad and _held(opt, model.embed.weight)
    assert any("decoder.weight is tied to embed.weight" in n for n in change.effect.notes)
    both = Session(model, opt).freeze("embed", "decoder")  # every user frozen: it freezes
    assert not model.embed.weight.requires_grad and not _held(opt, model.embed.weight)
    assert not any("tied" in n for n in both.effect.notes)


def _gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1,
        n_embd=16,
        n_head=2,
        vocab_size=50,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.arange(8)[None], labels=torch.arange(8)[None]).loss.backward()
    opt.step()
    return model, opt


@pytest.mark.parametrize("alone", ["transformer.wte", "lm_head"])
def test_gpt2s_tied_embedding_names_the_one_command_that_freezes_it(alone):
    model, opt = _gpt2()
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError) as refused:
        Session(model, opt).freeze(alone)
    message = str(refused.value)
    assert "\n" not in message
    assert "freeze transformer.wte and lm_head in one command" in message or (
        "freeze lm_head and transformer.wte in one command" in message
    )
    assert_same(before, snapshot(model, opt))
    # the command it names works, and equals the same edit by hand
    hand, hand_opt = _gpt2()
    shared = hand.transformer.wte.weight
    shared.requires_grad_(False)
    for group in hand_opt.param_groups:
        group["params"] = [p for p in group["params"] if p is not shared]
    hand_opt.state.pop(shared, None)
    Session(model, opt).freeze("transformer.wte", "lm_head")
    assert not model.transformer.wte.weight.requires_grad
    assert [p.requires_grad for p in model.parameters()] == [
        p.requires_grad for p in hand.parameters()
    ]
    assert [len(g["params"]) for g in opt.param_groups] == [
        len(g["params"]) for g in hand_opt.param_groups
    ]
    assert len(opt.state) == len(hand_opt.state)


def test_unfreezing_a_tied_module_names_the_other_users():
    model, opt = _tied()
    tm = Session(model, opt)
    tm.freeze("embed", "decoder")
    change = tm.unfreeze("decoder")
    assert model.embed.weight.requires_grad
    assert any("tied to embed.weight: those train too" in n for n in change.effect.notes)


def test_a_batchnorm_used_twice_is_swapped_at_both_places_and_restored():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3, momentum=0.3)
    model = nn.Sequential(nn.Conv2d(3, 3, 1), bn, nn.Conv2d(3, 3, 1), bn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tm = Session(model, opt)
    tm.freeze(bn="frozen")
    assert isinstance(model[1], FrozenBatchNorm2d) and model[1] is model[3]
    tm.unfreeze()
    assert model[1] is bn and model[3] is bn


def test_a_batchnorm_shared_with_an_unselected_block_is_left_alone():
    bn = nn.BatchNorm2d(3)
    model = nn.Sequential(nn.Sequential(nn.Conv2d(3, 3, 1), bn), nn.Sequential(bn))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    change = Session(model, opt).freeze("0", bn="frozen")
    assert model[0][1] is bn and model[1][0] is bn and bn.weight.requires_grad
    assert any("0.1.weight is tied to 1.0.weight" in n for n in change.effect.notes)


def test_batchnorm_without_running_stats_keeps_its_eval_output_when_frozen():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, track_running_stats=False))
    x = torch.randn(4, 3, 5, 5)
    model.eval()
    expected = model(x)
    for policy in ("frozen", "eval"):
        tm = Session(copy.deepcopy(model))
        tm.freeze(bn=policy)
        frozen = tm.bound().model
        assert torch.allclose(frozen.eval()(x), expected)
        assert torch.allclose(frozen.train()(x), expected)


def test_a_frozen_batchnorm_copied_while_frozen_keeps_affine_and_momentum():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, affine=False, momentum=0.2))
    Session(model).freeze(bn="frozen")
    clone = copy.deepcopy(model)  # the original BatchNorm2d is unknown to the clone
    Session(clone).unfreeze()
    bn = clone[1]
    assert type(bn) is nn.BatchNorm2d and not bn.affine and bn.momentum == 0.2
    assert bn.weight is None and bn.track_running_stats


def _lazy():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.LazyLinear(2))
    return model, torch.optim.SGD(model[0].parameters(), lr=0.1)


@pytest.mark.parametrize(
    "call",
    [
        lambda tm: tm.summary(),
        lambda tm: tm.freeze("0"),
        lambda tm: tm.unfreeze("0"),
        lambda tm: tm.replace_head("auto", 3),
        lambda tm: tm.estimate(input_shape=(2, 3)),
    ],
    ids=["summary", "freeze", "unfreeze", "replace_head", "estimate"],
)
def test_lazy_modules_are_refused_with_the_fix_and_never_materialised(call):
    model, opt = _lazy()
    flags = [p.requires_grad for p in model[0].parameters()]
    with pytest.raises(TorchMagicError, match="run one"):
        call(Session(model, opt))
    assert isinstance(model[2].weight, nn.parameter.UninitializedParameter)
    assert [p.requires_grad for p in model[0].parameters()] == flags
    model(torch.randn(2, 3))  # the real batch still sizes it
    assert model[2].weight.shape == (2, 4)


def test_lazy_refusal_in_a_notebook_is_one_usage_error(ip):
    from IPython.core.error import UsageError

    ip.user_ns["model"], ip.user_ns["optimizer"] = _lazy()
    with pytest.raises(UsageError, match=r"lazy modules not initialised yet \(2: LazyLinear\)"):
        ip.run_line_magic("freeze", "0")


@pytest.mark.parametrize(
    "call",
    [
        lambda tm: tm.freeze("0"),
        lambda tm: tm.unfreeze("0"),
        lambda tm: tm.replace_head("auto", 3),
        lambda tm: tm.replace_head("2", 3),
    ],
    ids=["freeze", "unfreeze", "replace_head", "replace_head path"],
)
def test_torchscript_models_are_refused_in_one_line(call):
    model = torch.jit.script(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    flags = [p.requires_grad for p in model.parameters()]
    with pytest.raises(TorchMagicError, match="TorchScript") as info:
        call(Session(model, opt))
    assert "\n" not in str(info.value)
    assert [p.requires_grad for p in model.parameters()] == flags
    assert Session(model, opt).summary().rows  # reading it still works


@pytest.mark.parametrize(
    "call",
    [
        lambda tm: tm.replace_head("auto", 3),
        lambda tm: tm.freeze("0"),
        lambda tm: tm.unfreeze("0", lr=1e-3),
    ],
    ids=["replace_head", "freeze", "unfreeze"],
)
def test_lbfgs_group_changes_are_refused(call):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.LBFGS(model.parameters())
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError, match="LBFGS keeps one flat view"):
        call(Session(model, opt))
    assert_same(before, snapshot(model, opt))
    assert opt._params is opt.param_groups[0]["params"]


def test_hooks_on_a_replaced_head_run_on_the_new_one_and_their_handles_still_work():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    seen: list[object] = []
    handle = model[2].register_forward_hook(lambda m, i, o: seen.append(o.shape[-1]))
    model[2].register_forward_pre_hook(lambda m, i: seen.append("pre"))
    tm = Session(model, torch.optim.SGD(model.parameters(), lr=0.1))
    change = tm.replace_head("auto", 5, dropout=0.1)
    model(torch.randn(1, 3))
    assert seen == ["pre", 5]
    assert any("2 hook(s) now run on the new head" in n for n in change.effect.notes)
    handle.remove()
    seen.clear()
    model(torch.randn(1, 3))
    assert seen == ["pre"]
    tm.undo()
    assert isinstance(model[2], nn.Linear) and model[2].out_features == 2
    model(torch.randn(1, 3))
    assert seen == ["pre", "pre"]  # the old head has its (remaining) hook back
