"""The hyperparameters and spec of ``swa``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import interval_field, time_field


@dataclass
class SWAConfig:
    """Stochastic weight averaging (Izmailov et al., 2018), loaded into the model at ``swa_end``."""

    swa_start: str = time_field("0.7dur")
    swa_end: str = time_field("0.97dur")
    update_interval: str = interval_field("1ep")


SPEC = MethodSpec(
    name="swa",
    unsharded=(
        "its average is a whole copy of the model beside the shards"
        " (torch's AveragedModel copies the module, which FSDP2 does not allow); train with parallel=ddp"
    ),
    config=SWAConfig,
    position=200,
    order_reason="at BATCH_END (reversed) loads its average into the model before EMA reads the weights",
)
