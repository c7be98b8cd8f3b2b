"""The hyperparameters and spec of ``label_smoothing``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import fraction_field
from trainrun.kinds import Capability


@dataclass
class LabelSmoothingConfig:
    """Mix targets with the uniform distribution."""

    smoothing: float = fraction_field(0.1)


SPEC = MethodSpec(
    name="label_smoothing",
    config=LabelSmoothingConfig,
    position=150,
    order_reason="smooths the (mixed) targets before the loss and restores them after it",
    needs=frozenset({Capability.CLASS_IMAGES}),
)
