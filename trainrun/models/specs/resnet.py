"""The specs of ``model=resnet18|34|50|101``: torchvision's ResNets (trainrun/models/resnet.py)."""

from __future__ import annotations

from trainrun.kinds import Capability, KindSpec

RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101")

SPECS = tuple(
    KindSpec(
        name=name,
        builder="trainrun.models.resnet:build",
        family="resnet",
        batches="images",
        offers=frozenset({Capability.IMAGE_CONVNET, Capability.CONVOLUTIONS, Capability.ANY_IMAGE_SIDE}),
    )
    for name in RESNETS
)
