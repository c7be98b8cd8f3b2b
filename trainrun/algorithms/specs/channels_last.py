"""The hyperparameters and spec of ``channels_last``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.kinds import Capability


@dataclass
class ChannelsLastConfig:
    """Store the model's weights and activations in NHWC memory format."""


SPEC = MethodSpec(
    name="channels_last",
    config=ChannelsLastConfig,
    position=270,
    order_reason="last model change at INIT: every layer that surgery added becomes NHWC",
    needs=frozenset({Capability.CONVOLUTIONS}),
    systems=True,
)
