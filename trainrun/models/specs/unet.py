"""The spec of ``model=unet2d|unet3d``: MONAI's DynUNet, the nnU-Net network (trainrun/models/unet.py)."""

from __future__ import annotations

import math
from typing import Any

from trainrun.errors import ConfigError
from trainrun.kinds import Capability, KindSpec
from trainrun.models.specs import refuse_initializers


def check(config: Any) -> None:
    """A filter count and a stride per level, and training patches the levels divide."""
    refuse_initializers(config, "MONAI DynUNet's kaiming-normal")
    unet, patch = config.model.unet, list(config.data.segmentation.patch_size)
    if len(unet.filters) != len(unet.strides) or len(unet.strides) < 3:
        raise ConfigError(
            f"bad value for 'model.unet.filters': {len(unet.filters)} levels but model.unet.strides has "
            f"{len(unet.strides)} (one of each per level, at least 3)"
        )
    if unet.deep_supervision > len(unet.strides) - 2:
        raise ConfigError(
            f"bad value for 'model.unet.deep_supervision': {unet.deep_supervision} (at most "
            f"{len(unet.strides) - 2}: an extra output at each decoder level below the top and above the bottom)"
        )
    divisor = math.prod(unet.strides)
    if len(patch) != unet.dimensions or any(side <= 0 or side % divisor for side in patch):
        raise ConfigError(
            f"bad value for 'data.segmentation.patch_size': {patch} (model.unet.dimensions {unet.dimensions} sides, "
            f"each a multiple of {divisor}, the product of model.unet.strides)"
        )
    if unet.norm == "instance" and all(side == divisor for side in patch):
        raise ConfigError(
            f"bad value for 'data.segmentation.patch_size': {patch} leaves one voxel at the deepest level, which "
            f"instance norm cannot normalise; make a side at least {2 * divisor}"
        )


SPECS = (
    KindSpec(
        name="unet",
        builder="trainrun.models.unet:build",
        family="unet",
        batches="volumes",
        offers=frozenset({Capability.CONVOLUTIONS}),
        check=check,
    ),
)
