"""Samplers that split a data set among ranks."""

from __future__ import annotations

from collections.abc import Iterator

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
        return iter(list(super().__iter__())[self.skip :])

    def __len__(self) -> int:
        return super().__len__() - self.skip


class ShardSampler(Sampler[int]):
    """Every ``world_size``-th index from ``rank``, in order: each sample is seen by exactly one rank.

    ``DistributedSampler`` pads shards to equal length by repeating samples, which would bias a
    distributed evaluation; this sampler does not.
    """

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, length, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
