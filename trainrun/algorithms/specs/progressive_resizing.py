"""The hyperparameters and spec of ``progressive_resizing``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainrun.algorithms.specs import MethodSpec
from trainrun.errors import ConfigError
from trainrun.fields import choice_field, fraction_field, positive_field, positive_fraction_field
from trainrun.kinds import Capability


@dataclass
class ProgressiveResizingConfig:
    """Train at a reduced resolution that grows to full size (Touvron et al.; Composer's schedule)."""

    mode: str = choice_field("resize", "resize", "crop")
    initial_scale: float = positive_fraction_field(0.5)
    delay: float = fraction_field(0.4)  # fraction of the run at initial_scale
    finetune: float = fraction_field(0.2)  # final fraction at full size
    size_increment: int = positive_field(4)  # sizes are multiples of this
    # A loader that decodes at any size (FFCV) decodes at the side; false: at full side, each batch
    # shrunk on the device, as Composer's progressive resizing does (its published runs' loader work).
    loader_decodes: bool = True


def check(config: ProgressiveResizingConfig, run: Any) -> None:
    if config.delay + config.finetune > 1:
        raise ConfigError("bad value for 'algorithms.progressive_resizing': delay + finetune must be <= 1")


SPEC = MethodSpec(
    name="progressive_resizing",
    config=ProgressiveResizingConfig,
    position=60,
    order_reason="sizes the batch before ColOut drops rows and columns of it",
    varying_step_cost=True,
    check=check,
    needs=frozenset({Capability.CLASS_IMAGES, Capability.ANY_IMAGE_SIDE}),
)
