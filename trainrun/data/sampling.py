"""Samplers that split a data set among ranks."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler, Sampler


class ResumableSampler(DistributedSampler):
    """torch's ``DistributedSampler`` (seeded per epoch) that can start part-way into an epoch.

    ``skip`` leading samples of this rank's order are dropped for the current epoch only, so a run
    resumed from a mid-epoch checkpoint sees exactly the samples the uninterrupted run would.
    """

    skip: int = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        super().set_epoch(epoch)
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        """``DistributedSampler``'s order, kept as a tensor and handed out in chunks: a 10-billion-token
        corpus has ten million windows, which as one Python list would take about 400 MB per epoch."""
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            indices = torch.randperm(len(self.dataset), generator=generator)
        else:
            indices = torch.arange(len(self.dataset))
        if self.drop_last:
            indices = indices[: self.total_size]
        elif self.total_size > len(indices):  # padded with its own start, repeated as often as needed
            repeats = math.ceil((self.total_size - len(indices)) / len(indices))
            indices = torch.cat([indices, indices.repeat(repeats)[: self.total_size - len(indices)]])
        mine = indices[self.rank : self.total_size : self.num_replicas][self.skip :]
        for chunk in mine.split(1 << 16):
            yield from chunk.tolist()

    def __len__(self) -> int:
        return super().__len__() - self.skip


class ShardSampler(Sampler[int]):
    """Every ``world_size``-th index from ``rank``, in order, then as many repeats of one of them as
    make every rank's count ``ceil(length / world_size)``: each sample is scored by exactly one rank
    (the first :attr:`real` indices are this rank's share; the trainer leaves the repeats out of the
    metrics), and every rank runs the same evaluation passes, which under FSDP2 are collectives (a
    rank with one pass fewer would leave the others waiting in a weight gather). torch's
    ``DistributedSampler`` pads the same way but scores the repeats too, which biases an evaluation.
    """

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, length, world_size)
        self.real = len(self.indices)
        self.padded = math.ceil(length / world_size)

    def __iter__(self) -> Iterator[int]:
        yield from self.indices
        repeated = self.indices[0] if self.real else 0
        for _ in range(self.padded - self.real):
            yield repeated

    def __len__(self) -> int:
        return self.padded
