"""The spec of ``task=segmentation``: a label per voxel, mean Dice as quality."""

from __future__ import annotations

from typing import Any

from trainrun.errors import ConfigError
from trainrun.kinds import Capability, TaskSpec
from trainrun.quality import Quality


def check(config: Any) -> None:
    """A held-out fold among the folds, one output per class or region."""
    segmentation = config.data.segmentation
    if segmentation.fold >= segmentation.folds:
        raise ConfigError(
            f"bad value for 'data.segmentation.fold': {segmentation.fold} (folds are 0 to {segmentation.folds - 1})"
        )
    _check_outputs(config)
    axes = list(segmentation.mirror_axes)
    if len(set(axes)) != len(axes) or any(axis not in (0, 1, 2) for axis in axes):
        raise ConfigError(
            f"bad value for 'data.segmentation.mirror_axes': {axes} (distinct volume axes: 0 depth, 1 height, 2 width)"
        )


def _check_outputs(config: Any) -> None:
    """Regions name foreground labels, and the model has one output per class or region."""
    regions = [list(region) for region in config.data.segmentation.regions]
    labels = range(1, config.data.num_classes)
    for region in regions:
        if not region or any(label not in labels for label in region):
            raise ConfigError(
                f"bad value for 'data.segmentation.regions': {regions} (each region a non-empty list of the "
                f"foreground labels 1 to {config.data.num_classes - 1})"
            )
    outputs = len(regions) or config.data.num_classes
    if config.model.num_classes != outputs:
        what = f"{len(regions)} regions" if regions else f"{config.data.num_classes} classes"
        raise ConfigError(
            f"bad value for 'model.num_classes': {config.model.num_classes} but data '{config.data.name}' has {what} "
            "(one output each)"
        )


SPECS = (
    TaskSpec(
        name="segmentation",
        builder="trainrun.tasks.segmentation:build",
        batches="volumes",
        offers=frozenset({Capability.FOLDS}),
        check=check,
        quality=Quality("dice", "mean Dice"),
        trains_with="Dice + cross-entropy",
    ),
)
