"""The hyperparameters and spec of ``gated_linear_units``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.kinds import Capability


@dataclass
class GatedLinearUnitsConfig:
    """Transformer feed-forward layers become gated linear units, act(W_g x) * (W_v x) (Shazeer 2020)."""

    gated_layer_bias: bool = False  # the card found no biases best
    non_gated_layer_bias: bool = False


SPEC = MethodSpec(
    name="gated_linear_units",
    config=GatedLinearUnitsConfig,
    position=240,
    order_reason="rebuilds the feed-forward layers at INIT, before their norms are replaced",
    needs=frozenset({Capability.FEED_FORWARDS}),
)
