"""The hyperparameters and spec of ``ema``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import interval_field


@dataclass
class EMAConfig:
    """Exponential moving average of weights and buffers, evaluated in place of the weights."""

    half_life: str = interval_field("100ba")
    update_interval: str = interval_field("20ba")


SPEC = MethodSpec(
    name="ema",
    unsharded=(
        "its average is a whole copy of the model beside the shards"
        " (torch's AveragedModel copies the module, which FSDP2 does not allow); train with parallel=ddp"
    ),
    config=EMAConfig,
    position=190,
    order_reason="at BATCH_END (reversed) averages after SWA: the step that loads SWA's average feeds it to EMA",
)
