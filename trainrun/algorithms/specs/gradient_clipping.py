"""The hyperparameters and spec of ``gradient_clipping``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import choice_field, positive_field


@dataclass
class GradientClippingConfig:
    """Clip gradients by global norm, by value, or adaptively (AGC) before each step."""

    type: str = choice_field("norm", "norm", "value", "adaptive")
    threshold: float = positive_field(1.0)


SPEC = MethodSpec(
    name="gradient_clipping",
    config=GradientClippingConfig,
    position=170,
    order_reason="clips at BEFORE_OPTIMIZER_STEP the gradient SAM's second pass left",
)
