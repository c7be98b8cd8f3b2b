"""The hyperparameters and spec of ``fused_layers``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.kinds import Capability


@dataclass
class FusedLayersConfig:
    """Transformer layers: dropout-add-LayerNorm and dense-GeLU blocks compiled into fused kernels."""


SPEC = MethodSpec(
    name="fused_layers",
    config=FusedLayersConfig,
    position=260,
    order_reason="compiles each layer's blocks at INIT once every surgery inside them is done",
    needs=frozenset({Capability.ENCODER_LAYERS}),
    systems=True,
)
