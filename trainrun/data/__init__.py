"""Build the data a run reads: torch DataLoaders or FFCV loaders, behind one :class:`DataSpec`."""

from __future__ import annotations

import torch

from trainrun.core.distributed import SINGLE_PROCESS, Placement
from trainrun.data.sources import datasets
from trainrun.data.spec import DataSpec
from trainrun.data.torch_loader import TorchData
from trainrun.errors import DataError
from trainrun.schema import DataConfig
from trainrun.validation import check_batch_split

__all__ = ["DataSpec", "TorchData", "build_data", "datasets"]


def build_data(
    config: DataConfig,
    train_batch_size: int,
    eval_batch_size: int,
    seed: int,
    placement: Placement = SINGLE_PROCESS,
    device: torch.device | None = None,
) -> DataSpec:
    """One rank's data; batch sizes are global and divided among the run's ranks."""
    world_size, device = placement.world_size, device or torch.device("cpu")
    check_batch_split(train_batch_size, eval_batch_size, world_size)
    per_rank, eval_per_rank = train_batch_size // world_size, eval_batch_size // world_size
    if config.loader == "ffcv":
        from trainrun.data.ffcv import FFCVData

        return FFCVData(config, per_rank, eval_per_rank, seed, device, placement)
    if config.name == "text":
        from trainrun.data.masked_text import text_datasets

        train_set, val_set = text_datasets(config, placement)
    else:
        train_set, val_set = datasets(config)
    if len(train_set) // world_size < per_rank:
        raise DataError(
            f"train_batch_size {train_batch_size} is larger than the {len(train_set)} training samples of "
            f"'{config.name}'"
        )
    return TorchData(config, train_set, val_set, per_rank, eval_per_rank, seed, placement, device)
