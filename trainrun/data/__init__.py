"""Build the train and evaluation loaders a run reads, and the on-device preprocessing."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset

from trainrun.data.sampling import ResumableSampler, ShardSampler
from trainrun.errors import DataError
from trainrun.schema import DataConfig


@dataclass
class DataSpec:
    """The loaders of one rank and how to turn their uint8 batches into model inputs."""

    train: DataLoader
    eval: DataLoader
    sampler: ResumableSampler
    mean: torch.Tensor
    std: torch.Tensor

    def to(self, device: torch.device) -> None:
        """Keep the normalisation constants on ``device``."""
        self.mean, self.std = self.mean.to(device), self.std.to(device)

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (already on the device) to normalised float32."""
        return images.float().sub_(self.mean).div_(self.std)


def datasets(config: DataConfig) -> tuple[Dataset, Dataset]:
    """Train and validation sets named by ``config``."""
    if config.name == "folder":
        from trainrun.data.folder import folder_datasets

        return folder_datasets(config)
    if config.name == "synthetic":
        from trainrun.data.builtin import synthetic_datasets

        return synthetic_datasets(config)
    from trainrun.data.builtin import builtin_datasets

    return builtin_datasets(config)


def build_data(
    config: DataConfig, train_batch_size: int, eval_batch_size: int, seed: int, rank: int, world_size: int
) -> DataSpec:
    """Loaders for one rank; the batch sizes are global and divided among ``world_size`` ranks."""
    train_set, val_set = datasets(config)
    for name, size in (("train_batch_size", train_batch_size), ("eval_batch_size", eval_batch_size)):
        if size % world_size:
            raise DataError(f"{name} {size} does not divide among {world_size} ranks")
    per_rank = train_batch_size // world_size
    sampler = ResumableSampler(train_set, world_size, rank, shuffle=True, seed=seed, drop_last=True)
    if len(sampler) < per_rank:
        raise DataError(
            f"train_batch_size {train_batch_size} is larger than the {len(train_set)} training images of "
            f"'{config.name}' (at most {len(sampler) * world_size})"
        )
    workers = {
        "num_workers": config.num_workers,
        "pin_memory": config.pin_memory,
        "persistent_workers": config.persistent_workers and config.num_workers > 0,
        "prefetch_factor": config.prefetch_factor if config.num_workers > 0 else None,
    }
    # Own generator: iterator creation must not draw from the global RNG that augmentation uses,
    # or a run resumed mid-epoch would see different augmentations than the uninterrupted one.
    generator = torch.Generator().manual_seed(seed + rank)
    train = DataLoader(train_set, batch_size=per_rank, sampler=sampler, drop_last=True, generator=generator, **workers)
    evaluation = DataLoader(
        val_set,
        batch_size=eval_batch_size // world_size,
        sampler=ShardSampler(len(val_set), rank, world_size),
        **workers,
    )
    scale = torch.tensor(255.0)
    return DataSpec(
        train=train,
        eval=evaluation,
        sampler=sampler,
        mean=(torch.tensor(config.mean) * scale).view(1, 3, 1, 1),
        std=(torch.tensor(config.std) * scale).view(1, 3, 1, 1),
    )
