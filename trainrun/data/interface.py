"""What the trainer needs from a data source, whichever loader reads it, and what a source gives."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from trainrun.core.distributed import SINGLE_PROCESS, Placement
from trainrun.registry import builder
from trainrun.schema import DataConfig


@dataclass(frozen=True)
class TextFacts:
    """What text data tells the rest of the run: the model matches its vocabulary, the attention
    kernels are chosen for its length, the export ships its tokenizer."""

    vocab_size: int
    max_seq_len: int  # the longest sequence a batch holds
    tokenizer_file: Path | None  # the store's tokenizer.json (None: token shards given without one)
    separator: int  # the token id between documents (a GPT's document mask reads it)
    separator_begins: bool = False  # it begins each document (llm.c's shards), not ends it (trainrun's stores)
    sources: tuple[str, ...] = ()  # a mixture's corpora: validation batches say which each window is from
    source_weights: tuple[float, ...] = ()  # their shares of training (summing to 1), which weigh eval_loss
    real_token_share: float = 1.0  # of a window's positions that hold tokens, not padding (packed: all)


@dataclass
class Datasets:
    """What a data source (:mod:`trainrun.registry`, kind ``data``) gives the torch loader: the two
    sets, how to batch their samples, and for text its facts. Unpacks as ``train, val``."""

    train: Dataset
    val: Dataset
    collate: Callable[[list], object] | None = None  # None: torch's default collation
    text: TextFacts | None = None
    eval_collate: Callable[[list], object] | None = None  # None: as ``collate``

    def __iter__(self) -> Iterator[Dataset]:
        return iter((self.train, self.val))


def datasets(config: DataConfig, placement: Placement = SINGLE_PROCESS, augment: bool = True) -> Datasets:
    """The training and validation sets of the source ``data.name`` names (:mod:`trainrun.registry`);
    ``augment=False`` gives the stored samples."""
    return builder("data", config.name)(config, placement, augment)


class DataSpec(ABC):
    """One rank's training and evaluation batches, in the form the run's task reads them (the
    image task: ``(uint8 images, labels)``, on the CPU or already on the device)."""

    batches_per_epoch: int
    text: TextFacts | None = None  # text data only
    # this rank's own evaluation samples: its evaluation batches hold them first, then repeats that
    # keep every rank's passes equal (None: every sample of every batch is this rank's)
    eval_samples: int | None = None

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

    def unreadable_files(self) -> list[str]:
        """The files this rank's loaders skipped because they could not be read (a source that
        skips such files says so; the others stop on them)."""
        return []
