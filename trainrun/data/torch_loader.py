"""torch DataLoaders over map-style datasets, with per-image transforms that algorithms add."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from trainrun.core.distributed import SINGLE_PROCESS, Placement, cores_per_process
from trainrun.core.seeding import keyed_seed
from trainrun.data.interface import Datasets, DataSpec
from trainrun.data.sampling import ResumableSampler, ShardSampler
from trainrun.schema import DataConfig


class AugmentedDataset(Dataset):
    """A training set whose random draws (augmentation, masking) depend only on (seed, epoch, sample).

    Items are asked for by ``(epoch, index)`` (:class:`EpochKeys`); torch's default generator,
    which torchvision's transforms draw from, is seeded with the ``keyed_seed`` of (seed, epoch,
    sample) and restored after it. A sample is then augmented alike whichever rank or loader
    worker reads it, so the number of ranks does not change what is trained, and the model's own random draws
    (dropout, stochastic depth, mixing) do not depend on how many images were loaded. Algorithms
    add per-image transforms to ``transforms``.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed
        self.transforms: list[Callable[[torch.Tensor], torch.Tensor]] = []

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        generator = torch.default_generator
        saved = generator.get_state()
        generator.manual_seed(keyed_seed(self.seed, epoch, index))
        try:
            item = self.dataset[index]
            if self.transforms:
                image, label = item
                for transform in self.transforms:
                    image = transform(image)
                item = image, label
        finally:
            generator.set_state(saved)
        return item

    def __getitems__(self, keys: list[tuple[int, int]]) -> Any:
        """A batch: read at once where the data set gathers batches (it then draws nothing at random,
        and no transform is added; one whose samples depend on the seed and epoch is given them,
        ``gather_keyed``), else sample by sample."""
        keyed = getattr(self.dataset, "gather_keyed", None)
        if keyed is not None and not self.transforms:
            return keyed(self.seed, keys)
        gather = getattr(self.dataset, "__getitems__", None)
        if gather is not None and not self.transforms:
            return gather([index for _, index in keys])
        return [self[key] for key in keys]


class EpochKeys(Sampler[tuple[int, int]]):
    """``(epoch, index)`` for each index ``sampler`` yields in its current epoch."""

    def __init__(self, sampler: ResumableSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((self.sampler.epoch, index) for index in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


class TorchData(DataSpec):
    """torch DataLoaders over map-style datasets, sharded by :class:`ResumableSampler`."""

    def __init__(
        self,
        config: DataConfig,
        sets: Datasets,
        per_rank_batch: int,
        eval_batch: int,
        seed: int,
        placement: Placement = SINGLE_PROCESS,
        device: torch.device | None = None,
    ) -> None:
        rank, world_size = placement.rank, placement.world_size
        train_set, val_set, self.text = sets.train, sets.val, sets.text
        self.train_set = AugmentedDataset(train_set, seed)
        self.sampler = ResumableSampler(
            train_set, placement.data_ranks, placement.data_rank, shuffle=True, seed=seed, drop_last=True
        )
        self._built_from = (config, sets, per_rank_batch, eval_batch, seed, placement, device)  # for_replica
        # pinned host batches let the trainer's non-blocking copies overlap the previous step
        on_cuda = device is not None and device.type == "cuda"
        pin_memory = on_cuda if config.pin_memory is None else config.pin_memory
        count = cores_per_process() if config.num_workers == -1 else config.num_workers
        workers = {
            "num_workers": count,
            "pin_memory": pin_memory,
            "persistent_workers": config.persistent_workers and count > 0,
            "prefetch_factor": config.prefetch_factor if count > 0 else None,
            "collate_fn": sets.collate,
        }
        # Own generator: iterator creation must not draw from the global RNG the model's own random
        # draws use, or a run resumed mid-epoch would continue differently from the uninterrupted one.
        generator = torch.Generator().manual_seed(seed + rank)
        self.train = DataLoader(
            self.train_set,
            batch_size=per_rank_batch,
            sampler=EpochKeys(self.sampler),
            drop_last=True,
            generator=generator,
            **workers,
        )
        eval_sampler = ShardSampler(len(val_set), rank, world_size)
        self.eval_samples = eval_sampler.real
        self.eval = DataLoader(
            val_set,
            batch_size=eval_batch,
            sampler=eval_sampler,
            **{**workers, "collate_fn": sets.eval_collate or sets.collate},
        )
        self.per_rank_batch = per_rank_batch
        self.batches_per_epoch = len(self.train)

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator:
        self.sampler.set_epoch(epoch, skip=skip * self.per_rank_batch)
        return iter(self.train)

    def for_replica(self, replica: int) -> TorchData:
        """This rank's counterpart's training batches in replica group ``replica`` (its share of each
        step, which this rank trains while that group is lost), with this rank's transforms."""
        config, sets, per_rank_batch, eval_batch, seed, placement, device = self._built_from
        other = TorchData(config, sets, per_rank_batch, eval_batch, seed, placement.of_replica(replica), device)
        other.train_set.transforms = self.train_set.transforms
        return other

    def eval_batches(self) -> Iterable:
        return self.eval

    def add_train_transform(self, transform: Callable[[torch.Tensor], torch.Tensor]) -> bool:
        self.train_set.transforms.append(transform)
        return True

    def unreadable_files(self) -> list[str]:
        sets = (self.train_set.dataset, self.eval.dataset)
        return [name for dataset in sets for name in getattr(dataset, "unreadable_files", list)()]
