"""The hyperparameters and spec of ``window_warmup``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainrun.algorithms.specs import MethodSpec
from trainrun.errors import ConfigError
from trainrun.fields import positive_field, positive_fraction_field
from trainrun.kinds import Capability


@dataclass
class WindowWarmupConfig:
    """Sliding-window attention whose window grows linearly over the run (the GPT-2 speedrun's schedule)."""

    start: int = positive_field(128)  # tokens each query sees at the first step (itself included)
    end: int = positive_field(1792)  # ... from ``duration`` of the run on
    duration: float = positive_fraction_field(1.0)  # fraction of the run it grows over
    multiple: int = positive_field(128)  # windows are rounded up to this (FlexAttention's block size)


def check(config: WindowWarmupConfig, run: Any) -> None:
    if config.start > config.end:
        raise ConfigError(
            f"bad value for 'algorithms.window_warmup.start': {config.start} is more than its end {config.end}"
        )


SPEC = MethodSpec(
    name="window_warmup",
    config=WindowWarmupConfig,
    position=215,
    order_reason="sets the model's attention window before each step and evaluation; reads nothing others change",
    needs=frozenset({Capability.ATTENTION_WINDOW}),
    varying_step_cost=True,
    check=check,
)
