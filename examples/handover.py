"""Constructors of the cluster hand-over tutorial (examples/cluster_handover.ipynb).

A resumed run needs the model, optimizer and scheduler built the way the notebook first
built them, so the notebook and its batch job both build them here. The training loader
shuffles with torch's global generator, which ``%tm save`` records and ``resume``
restores: a loader with a generator of its own would start its order afresh in the job.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from digits import load_digits_splits, pretrained_small_resnet
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

BATCH = 20
LABELS_PER_CLASS = 10


def build_model(cache: Path) -> nn.Module:
    """The quickstart's pretrained SmallResNet (cached under ``cache``), in train mode."""
    return pretrained_small_resnet(cache, verbose=False).train()


def build_optimizer(model: nn.Module) -> tuple[torch.optim.Optimizer, object]:
    """AdamW over every parameter and a cosine schedule stepped once per epoch."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    return optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=20)


def train_loader(rank: int = 0, world: int = 1) -> DataLoader:
    """The target task's labelled images; on several ranks, each rank's share of them
    (``DistributedSampler``, seeded, reshuffled by ``set_epoch``)."""
    data = load_digits_splits(labels_per_class=LABELS_PER_CLASS, seed=0).train
    if world == 1:
        return DataLoader(data, batch_size=BATCH, shuffle=True)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    return DataLoader(data, batch_size=BATCH // world, sampler=sampler)


def test_loader() -> DataLoader:
    data = load_digits_splits(labels_per_class=LABELS_PER_CLASS, seed=0).test
    return DataLoader(data, batch_size=512)


END_MARKER = "# ---- end of your constructors ----"

# What the notebook writes into the export's marked place: the constructors above, and on
# several ranks (``torchrun`` sets WORLD_SIZE) the process group and each rank's data.
CONSTRUCTORS = """\
import os
import sys

sys.path.insert(0, {examples!r})  # digits.py and handover.py
from handover import build_model, build_optimizer, train_loader as make_train_loader

world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
if world > 1:  # under torchrun: nccl on GPUs (the model on cuda:LOCAL_RANK), gloo on CPUs
    torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
model = build_model({cache!r})
optimizer, scheduler = build_optimizer(model)
train_loader = make_train_loader(rank, world)
"""

# What replaces the replayed commands: ``resume`` replays them from the checkpoint and
# loads every state, then the long run goes on: ``tm.fit`` in one process, the same
# epochs through DistributedDataParallel on several ranks (each rank's share of the data,
# gradients averaged), then each rank writes its weights.
CONTINUATION = """\
tm = torchmagic.resume({checkpoint!r}, model, optimizer, schedulers=[scheduler])
if world == 1:
    tm.fit(train_loader, epochs={epochs})
else:
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    for epoch in range({epochs}):
        train_loader.sampler.set_epoch(epoch)
        for images, labels in train_loader:
            loss = torch.nn.functional.cross_entropy(ddp(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
weights = {out!r}.format(rank=rank, world=world)
torch.save(model.state_dict(), weights)
print(f"rank {{rank}} of {{world}}: {epochs} more epochs trained, weights in {{weights}}")
if world > 1:
    torch.distributed.destroy_process_group()
"""


def batch_job(exported: str, checkpoint: Path, cache: Path, out: str, epochs: int) -> str:
    """The exported skeleton made a batch job that continues the saved session: the marked
    place filled with this module's constructors, and the Session with its replayed
    commands swapped for ``torchmagic.resume`` of ``checkpoint`` (which replays the same
    commands from the file) and ``epochs`` more epochs. ``out``: the weights' path, with
    ``{rank}`` and ``{world}`` in it."""
    head, rest = exported.split("# ---- build here", 1)
    start_marker, rest = rest.split("\n", 1)
    _, tail = rest.split(END_MARKER, 1)
    session = re.search(r"^tm = torchmagic\.Session\(", tail, flags=re.M)
    if session is None:
        raise ValueError("the exported script has no Session line")
    constructors = CONSTRUCTORS.format(examples=str(Path(__file__).parent), cache=str(cache))
    continuation = CONTINUATION.format(checkpoint=str(checkpoint), out=out, epochs=epochs)
    return (
        f"{head}# ---- build here{start_marker}\n{constructors}{END_MARKER}"
        f"{tail[: session.start()]}{continuation}"
    )
