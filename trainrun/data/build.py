"""Build the data a run reads: torch DataLoaders or FFCV loaders, behind one :class:`DataSpec`."""

from __future__ import annotations

import torch

from trainrun.core.distributed import SINGLE_PROCESS, Placement
from trainrun.data.interface import Datasets, DataSpec, datasets
from trainrun.data.torch_loader import TorchData
from trainrun.errors import DataError
from trainrun.schema import DataConfig

__all__ = ["DataSpec", "Datasets", "TorchData", "build_data", "datasets"]


def build_data(
    config: DataConfig,
    train_batch_size: int,
    eval_batch_size: int,
    seed: int,
    placement: Placement = SINGLE_PROCESS,
    device: torch.device | None = None,
) -> DataSpec:
    """One rank's data; batch sizes are global and divided among the run's ranks (that they divide
    evenly is checked before any process starts: :func:`trainrun.validation.check_batch_split`)."""
    world_size, device = placement.data_ranks, device or torch.device("cpu")
    # every replica group evaluates the whole evaluation set among its own ranks
    per_rank, eval_per_rank = train_batch_size // world_size, eval_batch_size // placement.world_size
    if config.loader == "ffcv":
        from trainrun.data.ffcv import FFCVData

        return FFCVData(config, per_rank, eval_per_rank, seed, device, placement)
    sets = datasets(config, placement)
    if len(sets.train) // world_size < per_rank:
        raise DataError(
            f"train_batch_size {train_batch_size} is larger than the {len(sets.train)} training samples of "
            f"'{config.name}'"
        )
    return TorchData(config, sets, per_rank, eval_per_rank, seed, placement, device)
