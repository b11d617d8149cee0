import pytest
import torch
import torchvision
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset
from torchvision import transforms

from torchmagic import Session, TorchMagicError


def data(n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 5, (n,), generator=g)


def probe_setup(bn="eval", model=None, head="fc"):
    torch.manual_seed(1)
    model = model or torchvision.models.resnet18(weights=None, num_classes=5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tm = Session(model, opt)
    tm.freeze(exclude=[head], bn=bn)
    return model, opt, tm


def run(cache: bool, own_batch_sampler: bool = False):
    model, opt, tm = probe_setup()
    x, y = data()
    dataset = TensorDataset(x, y)
    if own_batch_sampler:  # the loader's batch_size is None, yet it collates
        sampler = BatchSampler(RandomSampler(dataset), batch_size=16, drop_last=False)
        train = DataLoader(dataset, batch_sampler=sampler)
    else:
        train = DataLoader(dataset, batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(*data(32, seed=1)), batch_size=16, shuffle=True)
    torch.manual_seed(7)
    history = tm.fit(train, val=val, epochs=3, cache_features=cache)
    return model.fc.weight.detach().clone(), history


@pytest.mark.parametrize("own_batch_sampler", [False, True])
def test_cached_run_matches_the_uncached_one(own_batch_sampler):
    w_plain, h_plain = run(cache=False, own_batch_sampler=own_batch_sampler)
    w_cached, h_cached = run(cache=True, own_batch_sampler=own_batch_sampler)
    assert h_cached.cached_features and not h_plain.cached_features
    assert torch.allclose(w_plain, w_cached, atol=1e-5)
    for a, b in zip(h_plain.epochs, h_cached.epochs, strict=True):
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-5)
        assert a.val_loss == pytest.approx(b.val_loss, rel=1e-5)


def _refused(model, opt, tm, loader, fragment):
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(TorchMagicError, match=fragment):
        tm.fit(loader, cache_features=True)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def loader():
    return DataLoader(TensorDataset(*data(32)), batch_size=16)


def test_refuses_a_trainable_backbone():
    model, opt, tm = probe_setup()
    tm.unfreeze("layer4")
    _refused(model, opt, tm, loader(), "everything before the head")


def test_refuses_batchnorm_in_train_mode():
    """BatchNorm frozen by hand but left in train mode: its statistics would move."""
    torch.manual_seed(1)
    model = torchvision.models.resnet18(weights=None, num_classes=5)
    opt = torch.optim.AdamW(model.fc.parameters(), lr=1e-2)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("fc."))
    _refused(model, opt, Session(model, opt), loader(), "would run in train mode")


def test_bn_train_keeps_normalization_weights_training_so_caching_is_refused():
    """``bn="train"`` is fastai's train_bn: the BatchNorm weights still train, so the
    backbone is not frozen and its features cannot be cached."""
    model, opt, tm = probe_setup(bn="train")
    _refused(model, opt, tm, loader(), "bn1.weight, bn1.bias")


def test_refuses_random_augmentation():
    class Images(Dataset):
        transform = transforms.Compose(
            [transforms.RandomHorizontalFlip(), transforms.Normalize([0.5] * 3, [0.5] * 3)]
        )

        def __len__(self):
            return 8

        def __getitem__(self, i):
            return self.transform(torch.rand(3, 32, 32)), i % 5

    model, opt, tm = probe_setup()
    _refused(model, opt, tm, DataLoader(Images(), batch_size=4), "RandomHorizontalFlip")


def test_refuses_dropout_before_the_head():
    body = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 16), nn.Dropout(0.5))
    model, opt, tm = probe_setup(model=nn.Sequential(body, nn.Linear(16, 5)), head="1")
    _refused(model, opt, tm, loader(), "Dropout")


def test_refuses_work_after_the_head():
    class Softmaxed(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 16))
            self.fc = nn.Linear(16, 5)

        def forward(self, x):
            return self.fc(self.body(x)).softmax(-1)

    model, opt, tm = probe_setup(model=Softmaxed())
    _refused(model, opt, tm, loader(), "does more after its head")


def test_dropout_inside_the_head_is_kept_on_the_cached_side():
    model, opt, tm = probe_setup()
    tm.replace_head("fc", 5, dropout=0.3)
    x, y = data()
    history = tm.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=2, cache_features=True)
    assert history.cached_features and history.steps == 12
