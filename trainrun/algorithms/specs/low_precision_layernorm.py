"""The hyperparameters and spec of ``low_precision_layernorm``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.kinds import Capability


@dataclass
class LowPrecisionLayerNormConfig:
    """LayerNorm runs in the autocast dtype (fp16 / bf16) instead of fp32; no effect without autocast."""


SPEC = MethodSpec(
    name="low_precision_layernorm",
    config=LowPrecisionLayerNormConfig,
    position=250,
    order_reason="replaces every LayerNorm at INIT, including any that surgery added",
    needs=frozenset({Capability.LAYER_NORMS}),
)
