"""The hyperparameters and spec of ``sam``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainrun.algorithms.specs import MethodSpec
from trainrun.errors import ConfigError
from trainrun.fields import positive_field


@dataclass
class SAMConfig:
    """Sharpness-aware minimisation (Foret et al., 2021) every ``interval`` steps."""

    rho: float = positive_field(0.05)
    epsilon: float = positive_field(1.0e-12)
    interval: int = positive_field(1)


def check(config: SAMConfig, run: Any) -> None:
    if run.device_train_microbatch_size is not None:
        raise ConfigError(
            "algorithm 'sam' cannot run with 'device_train_microbatch_size': its second pass needs the "
            "whole batch's gradient before any micro-batch can run it"
        )


SPEC = MethodSpec(
    name="sam",
    unsharded=(
        "its ascent step perturbs the weights by each rank's own whole gradient"
        ", which FSDP2 only holds reduced into shards; train with parallel=ddp"
    ),
    config=SAMConfig,
    position=160,
    order_reason=(
        "after label smoothing: at AFTER_LOSS (reversed) SAM records the smoothed targets before "
        "label smoothing restores the originals"
    ),
    check=check,
)
