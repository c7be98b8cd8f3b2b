"""The hyperparameters and spec of ``bce_loss``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec


@dataclass
class BCELossConfig:
    """Binary cross-entropy per class instead of softmax cross-entropy."""

    bias_init: bool = True  # classifier bias at -ln(C), so sigmoid outputs start near 1/C


SPEC = MethodSpec(
    name="bce_loss",
    config=BCELossConfig,
    position=140,
    order_reason="replaces the loss at INIT; no other method touches it",
)
