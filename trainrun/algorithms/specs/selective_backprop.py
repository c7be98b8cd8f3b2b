"""The hyperparameters and spec of ``selective_backprop``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainrun.algorithms.specs import MethodSpec
from trainrun.errors import ConfigError
from trainrun.fields import fraction_field, positive_field, positive_fraction_field
from trainrun.kinds import Capability


@dataclass
class SelectiveBackpropConfig:
    """Backpropagate only a loss-weighted sample of each batch (Jiang et al., 2019)."""

    start: float = fraction_field(0.5)  # fraction of the run
    end: float = fraction_field(0.9)
    keep: float = positive_fraction_field(0.5)  # share of the batch kept
    scale_factor: float = positive_fraction_field(1.0)  # scoring resolution
    interval: int = positive_field(2)  # every interval-th batch is a full one


def check(config: SelectiveBackpropConfig, run: Any) -> None:
    if config.start > config.end:
        raise ConfigError("bad value for 'algorithms.selective_backprop': start must be <= end")


SPEC = MethodSpec(
    name="selective_backprop",
    config=SelectiveBackpropConfig,
    position=80,
    order_reason="scores and keeps examples of the batch as it will train: sized, before mixing",
    varying_step_cost=True,
    check=check,
    needs=frozenset({Capability.CLASS_IMAGES}),
)
