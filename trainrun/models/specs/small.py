"""The spec of ``model=resnet_small``: a ResNet for 8-32 px images (trainrun/models/small.py)."""

from __future__ import annotations

from trainrun.kinds import Capability, KindSpec

SPECS = (
    KindSpec(
        name="resnet_small",
        builder="trainrun.models.small:build",
        family="resnet",
        batches="images",
        offers=frozenset({Capability.IMAGE_CONVNET, Capability.CONVOLUTIONS, Capability.ANY_IMAGE_SIDE}),
    ),
)
