"""The hyperparameters and spec of ``randaugment``."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import positive_field
from trainrun.kinds import Capability


@dataclass
class RandAugmentConfig:
    """``depth`` random image operations per training image (torchvision's RandAugment)."""

    depth: int = positive_field(1)
    severity: int = field(default=9, metadata={"min": 0, "max": 20})  # of 20 levels; 10 = half strength


SPEC = MethodSpec(
    name="randaugment",
    config=RandAugmentConfig,
    position=120,
    order_reason="per-image transforms in the data pipeline; no order with batch methods",
    torch_loader_only=True,
    needs=frozenset({Capability.CLASS_IMAGES}),
)
