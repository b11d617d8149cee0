"""``%lora`` on ``transformers.Trainer``'s model: between two ``train()`` calls the adapters
train in the second (Trainer keeps its optimizer, which the command keeps in step),
bit for bit with the same adapters added by hand; before the first ``train()`` the
command says what Trainer will build, and Trainer builds it over the adapters."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchmagic import Session
from torchmagic.core.integrations import peft as peft_integration

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from builders import IDS, llama  # noqa: E402

TARGETS = [f"model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in ("q_proj", "v_proj")]


class Batches(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": IDS[i % 2], "labels": IDS[i % 2]}


def trainer(tmp_path, model: nn.Module) -> transformers.Trainer:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=[],
        max_steps=2,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    return transformers.Trainer(model=model, args=args, train_dataset=Batches())


def by_hand(trainer: transformers.Trainer) -> None:
    """The same edit in plain PyTorch and peft's layer: the targeted base weights stop
    training and leave their groups, the adapters join one new group at the head group's
    lr with the optimizer's defaults, the constant schedule gets one more entry."""
    model = trainer.model
    opt = trainer.optimizer.optimizer
    config = peft.LoraConfig(r=4, lora_alpha=16)
    torch.manual_seed(1)
    made = []
    for name in TARGETS:
        base = model.get_submodule(name)
        layer = peft.tuners.lora.layer.Linear(base, "default", config=config, r=4, lora_alpha=16)
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, layer)
        base.weight.requires_grad_(False)
        made.append(layer)
    bases = {id(p) for layer in made for p in layer.base_layer.parameters()}
    for group in opt.param_groups:
        group["params"] = [p for p in group["params"] if id(p) not in bases]
    for p in [p for p in opt.state if id(p) in bases]:
        del opt.state[p]
    adapters = [p for layer in made for p in peft_integration.adapter_parameters(layer)]
    lr = opt.param_groups[0]["initial_lr"]
    opt.add_param_group({**opt.defaults, "params": adapters, "lr": lr, "initial_lr": lr})
    schedule = trainer.lr_scheduler
    schedule.base_lrs.append(lr)
    schedule.lr_lambdas.append(schedule.lr_lambdas[0])
    schedule._last_lr.append(lr)


def test_lora_between_two_train_calls_trains_the_adapters_as_by_hand(tmp_path):
    ours = trainer(tmp_path / "a", llama())
    hand = trainer(tmp_path / "b", llama())
    ours.train()
    hand.train()
    tm = Session(namespace={"trainer": ours})
    torch.manual_seed(1)
    change = tm.lora("trainer.model", "q_proj,v_proj", r=4)
    assert change.optimizer_name == "trainer.optimizer"
    assert change.effect.modules == tuple(TARGETS)
    by_hand(hand)
    inner = ours.optimizer.optimizer
    adapters = peft_integration.adapters_of(ours.model)
    assert [id(p) for p in inner.param_groups[-1]["params"]] == [id(p) for p in adapters]
    before = [p.detach().clone() for p in adapters]
    ours.train()
    hand.train()
    assert ours.optimizer.optimizer is inner  # Trainer kept its optimizer
    assert any(not torch.equal(a, b) for a, b in zip(adapters, before, strict=True))
    theirs = dict(hand.model.named_parameters())
    for name, p in ours.model.named_parameters():
        assert torch.equal(p, theirs[name]) and p.requires_grad == theirs[name].requires_grad, name
    with torch.no_grad():
        assert torch.equal(ours.model(input_ids=IDS).logits, hand.model(input_ids=IDS).logits)


def test_before_the_first_train_the_command_says_what_trainer_builds(tmp_path, ip):
    model = llama()
    run = trainer(tmp_path, model)
    ip.user_ns["trainer"] = run
    ip.run_line_magic("freeze", "trainer.model")
    tm = Session(namespace=ip.user_ns)
    change = tm.lora("trainer.model", "q_proj,v_proj", r=4)
    (note,) = [n for n in change.effect.notes if n.startswith("`trainer`")]
    assert f"has no optimizer yet: its train() builds {run.args.optim.value} (lr 0.001" in note
    run.train()
    built = [p for g in run.optimizer.optimizer.param_groups for p in g["params"]]
    assert {id(p) for p in built} == {id(p) for p in peft_integration.adapters_of(model)}
