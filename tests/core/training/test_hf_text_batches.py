"""Hugging Face text batches (``input_ids``, ``attention_mask``, ``labels``, as a dict or
the ``BatchEncoding`` a collator returns) train through ``%fit``, ``fit``, ``lr_find``
and ``cache_features``: the model is called as ``model(**inputs)`` without the labels, and
the loss reads ``output.logits``."""

from __future__ import annotations

import pytest
import torch
from IPython.utils.capture import capture_output

from builders import TEXT_LENGTH, collate_text, text_loaders, text_rows, tiny_bert
from torchmagic import Session
from torchmagic.core.training.data import KeywordInputs, split_batch, to_device
from torchmagic.magics.extension import loaded

transformers = pytest.importorskip("transformers")

def test_a_text_batch_splits_into_keywords_and_labels():
    batch = collate_text(text_rows(4))
    inputs, labels = split_batch(batch)
    assert isinstance(inputs, KeywordInputs) and set(inputs) == {"input_ids", "attention_mask"}
    assert labels is batch["labels"]
    assert isinstance(to_device(inputs, torch.device("cpu"), False), KeywordInputs)
    plain = {"input_ids": batch["input_ids"], "labels": batch["labels"]}  # default_collate
    assert isinstance(split_batch(plain)[0], KeywordInputs)


def test_fit_trains_a_text_classifier_from_batch_encodings():
    model = tiny_bert()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = model.bert.encoder.layer[0].attention.self.query.weight.detach().clone()
    train, val = text_loaders()
    history = Session(model, opt).fit(train, val=val, epochs=2)
    assert history.steps == 12 and history.samples == 96
    assert all(e.val_accuracy is not None for e in history.epochs)
    assert not torch.equal(before, model.bert.encoder.layer[0].attention.self.query.weight)


def test_lr_find_and_cached_features_read_text_batches():
    model = tiny_bert(dropout=0.0)  # cached features need a deterministic backbone
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tm = Session(model, opt)
    train, val = text_loaders()
    assert len(tm.lr_find(train, steps=8).lrs) == 8
    tm.freeze(exclude=["classifier"])
    history = tm.fit(train, val=val, epochs=2, cache_features=True)
    assert history.cached_features and history.steps == 12


def test_fit_magic_with_a_collator_batch(ip):
    train_loader, val_loader = text_loaders()
    ip.user_ns.update(model=tiny_bert(), train_loader=train_loader, val_loader=val_loader)
    ip.run_cell("import torch\noptimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)")
    with capture_output():
        ip.run_line_magic("fit", "train_loader --val val_loader --epochs 1")
    (run,) = loaded(ip).session.fits
    assert run.model_name == "model" and run.steps == 6 and run.epochs[0].val_accuracy is not None


def test_device_compare_times_a_text_batch():
    model = tiny_bert()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = [p.detach().clone() for p in model.parameters()]
    report = Session(model, opt).compare_devices(text_loaders()[0], steps=2)
    assert report.batch_size == 8 and report.batch_bytes == 2 * 8 * TEXT_LENGTH * 8 + 8 * 8
    assert report.timings[0].timed and report.timings[0].step_ms > 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
