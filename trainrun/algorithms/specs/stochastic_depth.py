"""The hyperparameters and spec of ``stochastic_depth``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import choice_field, fraction_field
from trainrun.kinds import Capability


@dataclass
class StochasticDepthConfig:
    """Randomly skip residual branches in training (Huang et al., 2016)."""

    drop_rate: float = fraction_field(0.1)  # of the last block
    mode: str = choice_field("sample", "sample", "block")  # drop per sample, or the whole batch's branch
    distribution: str = choice_field("linear", "linear", "uniform")  # over the blocks, first to last


SPEC = MethodSpec(
    name="stochastic_depth",
    config=StochasticDepthConfig,
    position=10,
    order_reason="wraps whole residual blocks before any surgery inside them",
    needs=frozenset({Capability.CLASS_IMAGES, Capability.IMAGE_CONVNET}),
)
