"""The hyperparameters and spec of ``blurpool``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import non_negative_field
from trainrun.kinds import Capability


@dataclass
class BlurPoolConfig:
    """Anti-aliased downsampling (Zhang 2019)."""

    replace_convs: bool = True
    replace_maxpools: bool = True
    blur_first: bool = True
    min_channels: int = non_negative_field(16)


SPEC = MethodSpec(
    name="blurpool",
    config=BlurPoolConfig,
    position=20,
    order_reason="replaces strided convolutions before squeeze-excite gates them",
    needs=frozenset({Capability.CLASS_IMAGES, Capability.IMAGE_CONVNET}),
)
