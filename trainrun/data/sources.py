"""Map-style datasets a run reads: an image folder, a built-in set or synthetic images."""

from __future__ import annotations

from torch.utils.data import Dataset

from trainrun.schema import DataConfig


def datasets(config: DataConfig, augment: bool = True) -> tuple[Dataset, Dataset]:
    """Train and validation sets named by ``config``; ``augment=False`` gives the stored images."""
    if config.name == "folder":
        from trainrun.data.folder import folder_datasets

        return folder_datasets(config)
    if config.name == "synthetic":
        from trainrun.data.builtin import synthetic_datasets

        return synthetic_datasets(config)
    from trainrun.data.builtin import builtin_datasets

    return builtin_datasets(config, augment)
