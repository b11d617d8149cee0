"""What the checkpoint tests compare (a model and its optimizer by name, exactly) and the
small setups they save and resume."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from snapshots import equal


def structure(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """Flags, group members (by name) and every group's hyper-parameters."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        "flags": {n: p.requires_grad for n, p in model.named_parameters()},
        "groups": [[names[id(p)] for p in g["params"]] for g in opt.param_groups],
        "hyper": [
            {k: v for k, v in g.items() if k not in ("params", "param_names")}
            for g in opt.param_groups
        ],
        "shapes": {k: tuple(v.shape) for k, v in model.state_dict().items()},
    }


def state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """Weights, buffers and optimizer state by parameter name."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": {
            names[id(p)]: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
            for p, s in opt.state.items()
            if s
        },
    }


def assert_same(a: dict, b: dict, what: str = "") -> None:
    for key in a.keys() | b.keys():
        assert key in a and key in b, f"{what}{key} missing on one side"
        if isinstance(a[key], dict) and isinstance(b[key], dict) and not equal(a[key], b[key]):
            assert_same(a[key], b[key], f"{what}{key}.")
        assert equal(a[key], b[key]), f"{what}{key} differs"


def batches(n: int, shape: tuple[int, ...], classes: int, seed: int = 1) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(*shape, generator=gen), torch.randint(0, classes, (shape[0],), generator=gen))
        for _ in range(n)
    ]


def train(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    data: Iterable,
    step_schedulers: Callable[[], None] = lambda: None,
    forward: Callable | None = None,
) -> None:
    """Plain steps: forward, cross entropy, backward, step, zero_grad, the schedulers."""
    model.train()
    for inputs, targets in data:
        out = forward(model, inputs) if forward is not None else model(inputs)
        nn.functional.cross_entropy(out, targets).backward()
        opt.step()
        opt.zero_grad()
        step_schedulers()


def build_resnet18(seed: int = 0):
    """The issue's case: resnet18(num_classes=10), AdamW, cosine — built as a notebook does."""
    torch.manual_seed(seed)
    model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)


def build_convnext(seed: int = 0):
    """timm's convnext_atto with create_optimizer_v2's decay / no-decay groups and timm's
    CosineLRScheduler (stepped per epoch, with warmup)."""
    import timm
    from timm.optim import create_optimizer_v2
    from timm.scheduler import CosineLRScheduler

    torch.manual_seed(seed)
    model = timm.create_model("convnext_atto", pretrained=False, num_classes=10)
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    return model, opt, CosineLRScheduler(opt, t_initial=10, warmup_t=1, warmup_lr_init=1e-5)


def build_bert(seed: int = 0):
    """A tiny BertForSequenceClassification from a config (dropout on), AdamW and
    transformers' linear warmup."""
    from transformers import BertConfig, BertForSequenceClassification
    from transformers import get_linear_schedule_with_warmup as warmup

    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, warmup(opt, 2, 20)


def token_batches(n: int, classes: int = 4) -> list:
    gen = torch.Generator().manual_seed(0)
    return [
        (
            torch.randint(0, 50, (4, 8), generator=gen),
            torch.randint(0, classes, (4,), generator=gen),
        )
        for _ in range(n)
    ]


def logits(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=input_ids).logits


def amp_train(tm, model: nn.Module, opt: torch.optim.Optimizer, data: Iterable, sched) -> None:
    """A notebook's own loop under the session's AMP policy: tm.autocast() and tm.step."""
    model.train()
    for inputs, targets in data:
        with tm.autocast():
            loss = nn.functional.cross_entropy(model(inputs), targets)
        tm.step(loss, opt)
        sched.step()


def everything(model: nn.Module, opt: torch.optim.Optimizer, scheduler) -> dict:
    """What must continue bit for bit: structure, state and the scheduler's own state."""
    return {
        "structure": structure(model, opt),
        "state": state(model, opt),
        "scheduler": scheduler.state_dict(),
    }


class Net(nn.Module):
    """Small, with BatchNorm and Dropout (which draws from the global generator)."""

    def __init__(self, classes: int = 10, head: str = "fc", width: int = 8) -> None:
        super().__init__()
        self.head_name = head

        def block(c_in: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(c_in, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()
            )

        self.stem, self.layer1, self.layer2 = block(3), block(width), block(width)
        self.pool, self.drop = nn.AdaptiveAvgPool2d(1), nn.Dropout(0.2)
        setattr(self, head, nn.Linear(width, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.layer2(self.layer1(self.stem(x)))).flatten(1)
        return getattr(self, self.head_name)(self.drop(x))


def build_net(seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    model = Net(**kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)
    return model, opt, sched


def loader() -> DataLoader:
    data = batches(1, (24, 3, 8, 8), 4, seed=3)[0]
    return DataLoader(TensorDataset(*data), batch_size=6, shuffle=True)
