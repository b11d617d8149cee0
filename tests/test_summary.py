import torchvision
from torch import nn

from torchmagic import Session


def test_rows_counts_state_groups(trained):
    model, opt = trained
    tm = Session(model, opt)
    tm.freeze("layer1-3")
    tm.unfreeze("layer4", lr=1e-4)
    report = tm.summary(depth=1)
    rows = {r.name: r for r in report.rows}
    assert rows["model"].state == "partial"
    assert rows["layer1"].state == "frozen" and rows["layer1"].bn == "held 4"
    assert rows["layer4"].state == "trainable" and rows["layer4"].groups == "layer4"
    assert rows["layer4"].lr == "0.0001"
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
