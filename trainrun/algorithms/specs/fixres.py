"""The hyperparameters and spec of ``fixres``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainrun.algorithms.specs import MethodSpec
from trainrun.errors import ConfigError
from trainrun.fields import positive_field
from trainrun.kinds import Capability


@dataclass
class FixResConfig:
    """Train at a lower resolution than evaluation (Touvron et al., 2019)."""

    train_resolution: int = positive_field(176)  # below data.eval_resolution (e.g. 176 -> 224)


def check(config: FixResConfig, run: Any) -> None:
    if config.train_resolution >= run.data.eval_resolution:
        raise ConfigError(
            f"bad value for 'algorithms.fixres.train_resolution': {config.train_resolution} (must be below "
            f"data.eval_resolution {run.data.eval_resolution})"
        )


SPEC = MethodSpec(
    name="fixres",
    config=FixResConfig,
    position=50,
    order_reason="sets the full training resolution before progressive resizing scales it",
    check=check,
    needs=frozenset({Capability.CLASS_IMAGES, Capability.ANY_IMAGE_SIDE}),
)
