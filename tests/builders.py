"""Small models, optimizers and data that tests in several folders build the same way.

Each builder seeds torch itself, so two calls give the same weights. Hugging Face is
imported inside its builders: the tests that use them skip without it."""

from __future__ import annotations

from collections import OrderedDict

import torch
import torchvision
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader

# Token ids for the tiny language models (vocabulary 64, 12 positions of 16).
IDS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
TEXT_LENGTH = 12

# A notebook's training cell: train / val loaders of three blobs, an MLP and AdamW.
TRAINING_CELL = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
centers = torch.randn(3, 8) * 4
y = torch.randint(0, 3, (120,))
x = centers[y] + torch.randn(120, 8)
train = DataLoader(TensorDataset(x, y), batch_size=20, shuffle=True)
val = DataLoader(TensorDataset(x[:40], y[:40]), batch_size=20)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
"""


def blobs(n: int, classes: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points in 8 dimensions around ``classes`` well separated centres, and their
    classes: data a small MLP learns in a few epochs."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, 8, generator=g) * 4
    y = torch.randint(0, classes, (n,), generator=g)
    return centers[y] + torch.randn(n, 8, generator=g), y


def named_mlp() -> nn.Sequential:
    """6 → 8 → 8 → 3 with named layers (body1, act, body2, fc): two bodies and a head."""
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(body1=nn.Linear(6, 8), act=nn.ReLU(), body2=nn.Linear(8, 8), fc=nn.Linear(8, 3))
    )


def batchnorm_mlp() -> tuple[nn.Sequential, torch.optim.AdamW]:
    """8 → 16 (BatchNorm) → 16 → 4 (body, norm, act, mid, fc) and AdamW at 1e-2, for the
    blobs of ``blobs``."""
    torch.manual_seed(0)
    model = nn.Sequential(
        OrderedDict(
            body=nn.Linear(8, 16),
            norm=nn.BatchNorm1d(16),
            act=nn.ReLU(),
            mid=nn.Linear(16, 16),
            fc=nn.Linear(16, 4),
        )
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


def cnn_with_decay_groups() -> tuple[nn.Sequential, torch.optim.AdamW, StepLR]:
    """A tiny CNN (stem, block1, block2, pool, flat, fc), AdamW with decay / no-decay
    groups as timm's and Hugging Face's factories build them, and a StepLR; not stepped."""
    torch.manual_seed(0)
    model = nn.Sequential(
        OrderedDict(
            stem=_conv_block(3, 4),
            block1=_conv_block(4, 4),
            block2=_conv_block(4, 4),
            pool=nn.AdaptiveAvgPool2d(1),
            flat=nn.Flatten(),
            fc=nn.Linear(4, 3),
        )
    )
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    opt = torch.optim.AdamW(
        [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-2, weight_decay=0.01
    )
    return model, opt, StepLR(opt, step_size=2)


def resnet18_sgd(num_classes: int = 4) -> tuple[nn.Module, torch.optim.SGD]:
    """torchvision's resnet18 without weights and SGD with momentum over all of it."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def tiny_bert(dropout: float = 0.1) -> nn.Module:
    """A two-layer BertForSequenceClassification (3 labels) from a config."""
    import transformers

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


def text_rows(n: int = 48) -> list[dict[str, torch.Tensor]]:
    """Sentences whose second token says the class (ids for ``tiny_bert``)."""
    g = torch.Generator().manual_seed(0)
    made = []
    for i in range(n):
        ids = torch.randint(3, 40, (TEXT_LENGTH,), generator=g)
        ids[1] = 40 + i % 3
        made.append(
            {
                "input_ids": ids,
                "attention_mask": torch.ones(TEXT_LENGTH, dtype=torch.long),
                "labels": torch.tensor(i % 3),
            }
        )
    return made


def collate_text(items: list[dict[str, torch.Tensor]]) -> object:
    """What a Hugging Face collator returns: a BatchEncoding (a mapping, not a dict)."""
    import transformers

    return transformers.BatchEncoding({k: torch.stack([it[k] for it in items]) for k in items[0]})


def text_loaders() -> tuple[DataLoader, DataLoader]:
    """Train (48 rows, shuffled) and validation (24 rows) loaders of ``text_rows``."""
    train = DataLoader(text_rows(), batch_size=8, shuffle=True, collate_fn=collate_text)
    val = DataLoader(text_rows(24), batch_size=8, collate_fn=collate_text)
    return train, val


def gpt2() -> nn.Module:
    """A two-layer GPT2LMHeadModel (its attention is ``Conv1D``), dropout off."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel(config)


def llama() -> nn.Module:
    """A two-layer LlamaForCausalLM with grouped-query attention."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
    )
    return transformers.LlamaForCausalLM(config)
