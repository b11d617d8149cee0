"""``transformers.Trainer`` around its lifecycle. Before the first ``train()`` there is no
optimizer: ``unfreeze … lr=`` says what ``train()`` builds and that
``trainer.create_optimizer()`` gives the groups now; done so, the unfrozen layer trains in
``train()`` at its own lr bit for bit as by hand. Once the groups change, a checkpoint
saved before no longer resumes ("different number of parameter groups" inside
transformers): the command says so in one line, and so does the doctor."""

from __future__ import annotations

import pytest
import torch

from torchmagic import Session
from torchmagic.core.errors import TorchMagicError

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from builders import llama  # noqa: E402
from test_lora_trainer import Batches  # noqa: E402

LAYER = "trainer.model.model.layers.0"


def trainer(tmp_path, save: bool = False) -> transformers.Trainer:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=[],
        max_steps=2,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        save_strategy="steps" if save else "no",
        save_steps=2,
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    return transformers.Trainer(model=llama(), args=args, train_dataset=Batches())


def layer(run: transformers.Trainer) -> list[torch.nn.Parameter]:
    return list(run.model.model.layers[0].parameters())


def groups(run: transformers.Trainer) -> list[tuple[list[str], dict]]:
    opt = getattr(run.optimizer, "optimizer", run.optimizer)
    names = {id(p): n for n, p in run.model.named_parameters()}
    return [
        ([names[id(p)] for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
        for g in opt.param_groups
    ]


def test_before_the_first_train_lr_says_how_trainer_builds_its_optimizer(tmp_path):
    run = trainer(tmp_path)
    tm = Session(namespace={"trainer": run})
    tm.freeze(LAYER)
    with pytest.raises(TorchMagicError) as refused:
        tm.unfreeze(LAYER, lr=1e-4)
    text = str(refused.value)
    assert "\n" not in text and "`trainer` has no optimizer yet: its train() builds" in text
    assert "call trainer.create_optimizer() first" in text
    assert "optimizer = " not in text  # not a variable Trainer never reads
    assert run.optimizer is None and not any(p.requires_grad for p in layer(run))


def test_create_optimizer_first_then_the_layer_trains_at_its_lr_as_by_hand(tmp_path):
    ours, hand = trainer(tmp_path / "a"), trainer(tmp_path / "b")
    tm = Session(namespace={"trainer": ours})
    tm.freeze(LAYER)
    ours.create_optimizer()
    change = tm.unfreeze(LAYER, lr=1e-4)
    assert change.optimizer_name == "trainer.optimizer"
    # by hand: frozen before the optimizer, which leaves them out; then a group of their own
    for p in layer(hand):
        p.requires_grad_(False)
    hand.create_optimizer()
    for p in layer(hand):
        p.requires_grad_(True)
    named = {"params": layer(hand), "lr": 1e-4, "name": "model.layers.0"}  # groups get names
    hand.optimizer.add_param_group(named)
    assert groups(ours) == groups(hand)
    ours.train()
    hand.train()
    assert groups(ours) == groups(hand)
    assert groups(ours)[-1][1]["lr"] == 1e-4  # Trainer's schedule kept the lr
    theirs = dict(hand.model.named_parameters())
    for name, p in ours.model.named_parameters():
        assert torch.equal(p, theirs[name]) and p.requires_grad == theirs[name].requires_grad, name


def test_after_a_checkpoint_a_new_group_is_said_to_break_resuming_and_it_does(tmp_path):
    run = trainer(tmp_path, save=True)
    tm = Session(namespace={"trainer": run})
    tm.freeze(LAYER)
    run.train()
    checkpoint = tmp_path / "checkpoint-2"
    assert (checkpoint / "optimizer.pt").is_file()
    assert not [f for f in tm.doctor().findings if f.check == "library-out-of-step"]
    change = tm.unfreeze(LAYER, lr=1e-4)
    (note,) = [n for n in change.effect.notes if "resume_from_checkpoint" in n]
    assert "\n" not in note and note.startswith("trainer.train(resume_from_checkpoint=...) would")
    assert "saved 2 param groups, trainer.optimizer has 3" in note
    (finding,) = [f for f in tm.doctor().findings if f.check == "library-out-of-step"]
    assert finding.subject == "trainer" and "saved 2 param groups" in finding.message
    with pytest.raises(ValueError, match="different number of parameter groups"):
        run.train(resume_from_checkpoint=str(checkpoint))


def test_without_a_checkpoint_the_note_says_to_repeat_the_command_before_resuming(tmp_path):
    run = trainer(tmp_path)
    tm = Session(namespace={"trainer": run})
    tm.freeze(LAYER)
    run.train()
    change = tm.unfreeze(LAYER, lr=1e-4)
    (note,) = [n for n in change.effect.notes if "resume_from_checkpoint" in n]
    assert note.startswith("trainer's checkpoints now save 3 param groups")
