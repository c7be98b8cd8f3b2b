"""The hyperparameters and spec of ``layer_freezing``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import fraction_field
from trainrun.kinds import Capability


@dataclass
class LayerFreezingConfig:
    """Freeze the leading layers progressively towards the end of training."""

    freeze_start: float = fraction_field(0.5)  # fraction of the run
    freeze_level: float = fraction_field(1.0)  # frozen fraction at the end


SPEC = MethodSpec(
    name="layer_freezing",
    config=LayerFreezingConfig,
    position=180,
    order_reason="freezes layers at EPOCH_END after EMA and SWA have averaged the step",
    varying_step_cost=True,
    needs=frozenset({Capability.CLASS_IMAGES, Capability.IMAGE_CONVNET}),
)
