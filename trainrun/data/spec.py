"""What the trainer needs from a data source, whichever loader reads it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator

import torch

from trainrun.schema import DataConfig


class DataSpec(ABC):
    """One rank's training and evaluation batches, and how uint8 images become model inputs.

    Batches are ``(images, labels)`` with images uint8 (N, 3, H, W), on the CPU or already on the
    device. :meth:`prepare` normalises them on the device.
    """

    batches_per_epoch: int
    vocab_size: int | None = None  # text data: the tokenizer's vocabulary, which the model must match
    max_seq_len: int | None = None  # text data: the longest sequence a batch holds

    def __init__(self, config: DataConfig) -> None:
        scale = torch.tensor(255.0)
        self.mean = (torch.tensor(config.mean) * scale).view(1, 3, 1, 1)
        self.std = (torch.tensor(config.std) * scale).view(1, 3, 1, 1)

    def to(self, device: torch.device) -> None:
        """Keep the normalisation constants on ``device``."""
        self.mean, self.std = self.mean.to(device), self.std.to(device)

    def prepare(
        self, images: torch.Tensor, memory_format: torch.memory_format = torch.contiguous_format
    ) -> torch.Tensor:
        """uint8 images (already on the device) to normalised float32 in ``memory_format``, in one copy."""
        return images.to(torch.float32, memory_format=memory_format).sub_(self.mean).div_(self.std)

    @abstractmethod
    def train_batches(self, epoch: int, skip: int = 0) -> Iterator:
        """The batches of epoch ``epoch``, less the first ``skip`` (a mid-epoch resume)."""

    @abstractmethod
    def eval_batches(self) -> Iterable:
        """Every evaluation batch of this rank; each sample is seen by exactly one rank."""

    def add_train_transform(self, transform: Callable[[torch.Tensor], torch.Tensor]) -> bool:
        """Apply ``transform`` to each uint8 training image (C, H, W) from the first epoch on;
        False if this loader cannot run per-image Python transforms."""
        return False

    def set_train_resolution(self, size: int) -> bool:
        """Decode training images at ``size`` from the next epoch on; False if this loader cannot."""
        return False
