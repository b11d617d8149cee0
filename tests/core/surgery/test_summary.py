import pytest
import torch
import torchvision
from torch import nn
from torch.optim import lr_scheduler

from torchmagic import Session, render
from torchmagic.core.surgery.counting import describe_groups


def test_rows_counts_state_groups(trained):
    model, opt = trained
    tm = Session(model, opt)
    tm.freeze("layer1-3")
    tm.unfreeze("layer4", lr=1e-4)
    report = tm.summary(depth=1)
    rows = {r.name: r for r in report.rows}
    assert rows["model"].state == "partial"
    assert rows["layer1"].state == "frozen" and rows["layer1"].bn == {"held": 4}
    assert rows["layer1"].groups == ()
    (layer4_group,) = rows["layer4"].groups
    assert opt.param_groups[layer4_group]["params"][0] is model.layer4[0].conv1.weight
    assert report.groups[layer4_group].name == "layer4"
    assert report.lrs(rows["layer4"]) == (1e-4,)
    assert set(rows["model"].groups) == {0, layer4_group}
    assert rows["model"].bn == {"held": 4 + 5 + 5, "train": 1 + 5}  # layer1-3 | bn1, layer4
    assert rows["layer2"].params == sum(p.numel() for p in model.layer2.parameters())
    assert rows["relu"].state == ""
    assert report.counts.total == sum(p.numel() for p in model.parameters())
    assert report.counts.param_bytes == 4 * report.counts.total


def test_tied_weights_counted_once():
    emb = nn.Embedding(100, 16)
    head = nn.Linear(16, 100, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, head)
    report = Session(model).summary(depth=1)
    assert report.counts.total == 1600
    assert sum(r.params for r in report.rows if r.depth == 1) == 1600


def test_huge_models_collapse():
    model = torchvision.models.maxvit_t(weights=None)
    report = Session(model).summary(depth=6)
    assert len(report.rows) <= 60 and report.depth < 6


def test_subtree(resnet):
    report = Session(resnet).summary("model.layer4", depth=1)
    assert report.model_name == "model.layer4"
    assert report.counts.total == sum(p.numel() for p in resnet.layer4.parameters())


def test_summary_does_not_change_anything(trained):
    model, opt = trained
    flags = [p.requires_grad for p in model.parameters()]
    Session(model, opt).summary(depth=3)
    assert flags == [p.requires_grad for p in model.parameters()]


def _stepped(make_scheduler, steps: int = 3):
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    scheduler = make_scheduler(opt)
    for _ in range(steps):
        opt.step()
        scheduler.step(*([1.0] if isinstance(scheduler, lr_scheduler.ReduceLROnPlateau) else []))
    return model, opt, scheduler


@pytest.mark.parametrize(
    ("make_scheduler", "base_of"),
    [
        (lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, 5), lambda g, s: g["initial_lr"]),
        (lambda o: lr_scheduler.StepLR(o, 2, 0.5), lambda g, s: 0.1),
        (lambda o: lr_scheduler.OneCycleLR(o, 0.5, total_steps=10), lambda g, s: 0.5),
        (lambda o: lr_scheduler.CyclicLR(o, 0.01, 0.3, step_size_up=4), lambda g, s: 0.3),
        (lambda o: lr_scheduler.ReduceLROnPlateau(o, patience=0), lambda g, s: None),
    ],
)
def test_groups_carry_lr_now_base_lr_and_scheduler(make_scheduler, base_of):
    _, opt, scheduler = _stepped(make_scheduler)
    (info,) = describe_groups(opt, schedulers=[scheduler])
    group = opt.param_groups[0]
    assert info.lr == group["lr"] and info.weight_decay == 0.01
    assert info.base_lr == base_of(group, scheduler)
    assert info.schedulers == (type(scheduler).__name__,)
    assert describe_groups(opt)[0].base_lr is None  # no schedule known: the lr now is the base


def test_sequential_scheduler_is_named_once_by_its_parent():
    _, opt, _ = _stepped(lambda o: lr_scheduler.StepLR(o, 1, 0.5), steps=0)
    warmup = lr_scheduler.LinearLR(opt, 0.1, total_iters=2)
    cosine = lr_scheduler.CosineAnnealingLR(opt, 5)
    chain = lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[2])
    (info,) = describe_groups(opt, schedulers=[chain, warmup, cosine])
    assert info.schedulers == ("SequentialLR",)


def test_session_reports_the_bound_schedulers(trained):
    model, opt = trained
    scheduler = lr_scheduler.CosineAnnealingWarmRestarts(opt, 10)
    for _ in range(9):
        scheduler.step()
    tm = Session(model, opt, schedulers=[scheduler])
    change = tm.freeze("layer1")
    named = ("CosineAnnealingWarmRestarts `schedulers[0]`",)  # the path the Session holds it at
    assert [g.schedulers for g in change.groups] == [named]
    assert change.groups[0].base_lr == opt.param_groups[0]["initial_lr"] == 1e-3
    assert change.groups[0].lr == opt.param_groups[0]["lr"] < 1e-4
    (summary_group,) = tm.summary(depth=0).groups
    assert summary_group.base_lr == 1e-3 and summary_group.weight_decay == 0.05
    undone = tm.undo()
    assert undone.groups[0].schedulers == named


def _bert_with_timm_groups():
    """A Hugging Face model with timm's decay / no-decay groups and one unfrozen block at
    its own lr: long type names, long group names, modules in four groups."""
    transformers = pytest.importorskip("transformers")
    timm_optim = pytest.importorskip("timm.optim")
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128
    )
    model = transformers.BertForSequenceClassification(config)
    opt = timm_optim.create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    tm = Session(model, opt)
    tm.freeze("bert.embeddings")
    tm.unfreeze("bert.embeddings", lr=1e-4)
    return tm


def test_rendered_summary_never_breaks_a_name():
    tm = _bert_with_timm_groups()
    report = tm.summary(depth=3)
    text = str(render.render(report, 100))
    table_lines = text.split("\n… hidden")[0].splitlines()[3:]  # the rows under the header
    names = [line.split("│")[0].strip() for line in table_lines]
    expected = [r.name.rsplit(".", 1)[-1] for r in report.rows]
    assert [n for n in names if n] == expected  # every name on one line, none split
    assert "BertForSequenceClassification" in text and "BatchNorm" not in text.splitlines()[1]
    # the group column (names that would wrap) gives way at 100 columns, and says so
    assert "\n… hidden at 100 columns: group\n" in text
    assert all(len(line) <= 100 for line in text.splitlines())
    wide = str(render.render(report, 160))
    assert "│ 4 groups" in wide and "hidden" not in wide  # counted, not listed


def test_summary_without_an_optimizer_has_no_group_columns(resnet):
    header = str(render.render(Session(resnet).summary(depth=1), 100)).splitlines()[1]
    assert header.split() == ["module", "┃", "state", "┃", "params", "┃", "type", "┃", "BatchNorm"]
