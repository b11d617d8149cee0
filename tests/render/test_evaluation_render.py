"""How an evaluation draws: the worst inputs as pictures un-normalized with the loader's
Normalize, a text input's tokens decoded, the comparison line, the terminal table."""

from __future__ import annotations

import base64
import io
import re

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from torchmagic import Session, render
from torchmagic.core.evaluation import Comparison
from torchmagic.render.evaluation import comparison_text

MEAN, STD = (0.2, 0.4, 0.6), (0.5, 0.25, 0.125)


class Normalized(Dataset):
    """Images in [0, 1] served normalized, the way a torchvision pipeline does."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images
        self.transform = transforms.Compose([transforms.Normalize(MEAN, STD)])

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return self.transform(self.images[index]), index % 2


def _pngs(html: str) -> list[torch.Tensor]:
    found = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    return [
        torch.as_tensor(np.array(Image.open(io.BytesIO(base64.b64decode(data))))).reshape(-1, 3)
        for data in found
    ]


def test_worst_images_are_drawn_un_normalized_with_their_labels():
    images = (torch.arange(4 * 3 * 4 * 4) % 256 / 255.0).reshape(4, 3, 4, 4)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 2))
    session = Session(model)
    session.replace_head("1", labels=["left", "right"])
    ev = session.evaluate(DataLoader(Normalized(images), batch_size=2), worst=2)
    assert ev.normalization == (MEAN, STD)
    html = render.render(ev).html()
    pictures = _pngs(html)
    assert len(pictures) == 2
    for sample, pixels in zip(ev.worst, pictures, strict=True):
        want = (images[sample.index] * 255).round().permute(1, 2, 0).reshape(-1, 3)
        assert (pixels.to(torch.int64) - want.to(torch.int64)).abs().max() <= 1
    labels = ["left", "right"]
    for sample in ev.worst:
        assert f"true {labels[sample.target]}<br>predicted {labels[sample.predicted]}" in html
    text = str(render.render(ev))
    assert "the 2 largest losses" in text and "index" in text and "predicted" in text


class Words(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(10, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        return self.embed(input_ids)


def test_text_inputs_show_their_decoded_tokens():
    batches = [{"input_ids": torch.tensor([[1, 2, 3], [4, 5, 6]]), "labels": torch.tensor([0, 1])}]
    ev = Session(Words()).evaluate(batches, worst=2)
    assert all(set(w.input) == {"input_ids"} for w in ev.worst)
    vocabulary = "zero one two three four five six seven eight nine".split()
    decoded = ev.__class__(
        **{**ev.__dict__, "decode": lambda one: " ".join(vocabulary[i] for i in one["input_ids"])}
    )
    html = render.render(decoded).html()
    assert "one two three" in html and "four five six" in html


def test_the_comparison_line():
    assert comparison_text(Comparison(0.021, 14, 5, 0.0636)) == (
        "+2.1 points, 14 fixed / 5 broken, p = 0.064: not yet a clear gain"
    )
    assert comparison_text(Comparison(0.05, 25, 5, 0.0003)).endswith("p < 0.001: a clear gain")
    assert comparison_text(Comparison(-0.05, 5, 25, 0.0003)).endswith("a clear loss")
    assert comparison_text(Comparison(0.0, 0, 0, 1.0)).endswith("p = 1: no sample changed")
