"""The hyperparameters and spec of ``squeeze_excite``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import non_negative_field, positive_field
from trainrun.kinds import Capability


@dataclass
class SqueezeExciteConfig:
    """Channel gating after large convolutions (Hu et al., 2018)."""

    latent_channels: float = positive_field(64)  # >= 1: channels; < 1: fraction of the conv's output
    min_channels: int = non_negative_field(128)  # only convs with min(in, out) >= this


SPEC = MethodSpec(
    name="squeeze_excite",
    config=SqueezeExciteConfig,
    position=30,
    order_reason="after BlurPool, so a blurred strided convolution's inner conv gets the gate",
    needs=frozenset({Capability.CLASS_IMAGES, Capability.IMAGE_CONVNET}),
)
