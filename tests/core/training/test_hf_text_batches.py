"""Hugging Face text batches (``input_ids``, ``attention_mask``, ``labels``, as a dict or
the ``BatchEncoding`` a collator returns) train through ``%fit``, ``fit``, ``lr_find``
and ``cache_features``: the model is called as ``model(**inputs)`` without the labels, and
the loss reads ``output.logits``."""

from __future__ import annotations

import pytest
import torch
from IPython.utils.capture import capture_output
from torch.utils.data import DataLoader

from torchmagic import Session
from torchmagic.core.training.data import KeywordInputs, split_batch, to_device
from torchmagic.magics.extension import loaded

transformers = pytest.importorskip("transformers")

LENGTH = 12


def tiny_bert(dropout: float = 0.1):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=50,
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=3,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    return transformers.BertForSequenceClassification(config)


def rows(n: int = 48) -> list[dict[str, torch.Tensor]]:
    """Sentences whose second token says the class."""
    g = torch.Generator().manual_seed(0)
    made = []
    for i in range(n):
        ids = torch.randint(3, 40, (LENGTH,), generator=g)
        ids[1] = 40 + i % 3
        made.append(
            {
                "input_ids": ids,
                "attention_mask": torch.ones(LENGTH, dtype=torch.long),
                "labels": torch.tensor(i % 3),
            }
        )
    return made


def collate(items):
    """What a Hugging Face collator returns: a BatchEncoding (a mapping, not a dict)."""
    return transformers.BatchEncoding({k: torch.stack([it[k] for it in items]) for k in items[0]})


def loaders():
    train = DataLoader(rows(), batch_size=8, shuffle=True, collate_fn=collate)
    val = DataLoader(rows(24), batch_size=8, collate_fn=collate)
    return train, val


def test_a_text_batch_splits_into_keywords_and_labels():
    batch = collate(rows(4))
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
    train, val = loaders()
    history = Session(model, opt).fit(train, val=val, epochs=2)
    assert history.steps == 12 and history.samples == 96
    assert all(e.val_accuracy is not None for e in history.epochs)
    assert not torch.equal(before, model.bert.encoder.layer[0].attention.self.query.weight)


def test_lr_find_and_cached_features_read_text_batches():
    model = tiny_bert(dropout=0.0)  # cached features need a deterministic backbone
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tm = Session(model, opt)
    train, val = loaders()
    assert len(tm.lr_find(train, steps=8).lrs) == 8
    tm.freeze(exclude=["classifier"])
    history = tm.fit(train, val=val, epochs=2, cache_features=True)
    assert history.cached_features and history.steps == 12


def test_fit_magic_with_a_collator_batch(ip):
    ip.user_ns.update(model=tiny_bert(), train_loader=loaders()[0], val_loader=loaders()[1])
    ip.run_cell("import torch\noptimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)")
    with capture_output():
        ip.run_line_magic("fit", "train_loader --val val_loader --epochs 1")
    (run,) = loaded(ip).session.fits
    assert run.model_name == "model" and run.steps == 6 and run.epochs[0].val_accuracy is not None


def test_device_compare_times_a_text_batch():
    model = tiny_bert()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = [p.detach().clone() for p in model.parameters()]
    report = Session(model, opt).compare_devices(loaders()[0], steps=2)
    assert report.batch_size == 8 and report.batch_bytes == 2 * 8 * LENGTH * 8 + 8 * 8
    assert report.timings[0].timed and report.timings[0].step_ms > 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
