"""The hyperparameters and spec of ``mixup``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import positive_field
from trainrun.kinds import Capability


@dataclass
class MixUpConfig:
    """Convex combinations of pairs of images and of their labels (torchvision's MixUp)."""

    alpha: float = positive_field(0.2)


SPEC = MethodSpec(
    name="mixup",
    config=MixUpConfig,
    position=100,
    order_reason="mixes images and targets before label smoothing smooths the mixed targets",
    needs=frozenset({Capability.CLASS_IMAGES}),
)
