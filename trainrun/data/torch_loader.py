"""torch DataLoaders over map-style datasets, with per-image transforms that algorithms add."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from trainrun.core.distributed import SINGLE_PROCESS, Placement
from trainrun.data.sampling import ResumableSampler, ShardSampler
from trainrun.data.spec import DataSpec
from trainrun.schema import DataConfig


class AugmentedDataset(Dataset):
    """A dataset whose images pass through extra per-image transforms that algorithms add."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.transforms: list[Callable[[torch.Tensor], torch.Tensor]] = []

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = self.dataset[index]
        for transform in self.transforms:
            image = transform(image)
        return image, label


class TorchData(DataSpec):
    """torch DataLoaders over map-style datasets, sharded by :class:`ResumableSampler`."""

    def __init__(
        self,
        config: DataConfig,
        train_set: Dataset,
        val_set: Dataset,
        per_rank_batch: int,
        eval_batch: int,
        seed: int,
        placement: Placement = SINGLE_PROCESS,
        device: torch.device | None = None,
    ) -> None:
        super().__init__(config)
        rank, world_size = placement.rank, placement.world_size
        self.train_set = AugmentedDataset(train_set)
        self.sampler = ResumableSampler(train_set, world_size, rank, shuffle=True, seed=seed, drop_last=True)
        # pinned host batches let the trainer's non-blocking copies overlap the previous step
        on_cuda = device is not None and device.type == "cuda"
        pin_memory = on_cuda if config.pin_memory is None else config.pin_memory
        workers = {
            "num_workers": config.num_workers,
            "pin_memory": pin_memory,
            "persistent_workers": config.persistent_workers and config.num_workers > 0,
            "prefetch_factor": config.prefetch_factor if config.num_workers > 0 else None,
        }
        # Own generator: iterator creation must not draw from the global RNG that augmentation uses,
        # or a run resumed mid-epoch would see different augmentations than the uninterrupted one.
        generator = torch.Generator().manual_seed(seed + rank)
        self.train = DataLoader(
            self.train_set,
            batch_size=per_rank_batch,
            sampler=self.sampler,
            drop_last=True,
            generator=generator,
            **workers,
        )
        self.eval = DataLoader(
            val_set, batch_size=eval_batch, sampler=ShardSampler(len(val_set), rank, world_size), **workers
        )
        self.per_rank_batch = per_rank_batch
        self.batches_per_epoch = len(self.train)

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator:
        self.sampler.set_epoch(epoch, skip=skip * self.per_rank_batch)
        return iter(self.train)

    def eval_batches(self) -> Iterable:
        return self.eval

    def add_train_transform(self, transform: Callable[[torch.Tensor], torch.Tensor]) -> bool:
        self.train_set.transforms.append(transform)
        return True
