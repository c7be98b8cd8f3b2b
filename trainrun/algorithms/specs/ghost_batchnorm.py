"""The hyperparameters and spec of ``ghost_batchnorm``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import positive_field
from trainrun.kinds import Capability


@dataclass
class GhostBatchNormConfig:
    """Batch normalisation over small chunks of the batch (Hoffer et al., 2017)."""

    ghost_batch_size: int = positive_field(32)


SPEC = MethodSpec(
    name="ghost_batchnorm",
    config=GhostBatchNormConfig,
    position=40,
    order_reason="after the surgery that adds layers (BlurPool, squeeze-excite)",
    needs=frozenset({Capability.CLASS_IMAGES, Capability.IMAGE_CONVNET}),
)
