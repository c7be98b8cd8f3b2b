"""The hyperparameters and spec of ``alibi``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainrun.algorithms.specs import MethodSpec
from trainrun.errors import ConfigError
from trainrun.fields import positive_field, positive_fraction_field
from trainrun.kinds import Capability, offers


@dataclass
class AlibiConfig:
    """Attention biased by distance instead of learned position embeddings (Press et al. 2021)."""

    max_sequence_length: int = positive_field(1024)  # the longest sequence the model will accept
    # causal tasks: training sequences split into pieces of this share of their length (Composer's GPT: 0.25)
    train_sequence_length_scaling: float = positive_fraction_field(1.0)


def check(config: AlibiConfig, run: Any) -> None:
    """Training sequences are split only where the task's sequences are causal."""
    if config.train_sequence_length_scaling < 1 and Capability.CAUSAL_SEQUENCES not in offers(run):
        raise ConfigError(
            "bad value for 'algorithms.alibi.train_sequence_length_scaling': "
            f"{config.train_sequence_length_scaling} splits causal sequences only (task causal_lm); use 1.0"
        )


SPEC = MethodSpec(
    name="alibi",
    config=AlibiConfig,
    position=210,
    order_reason=(
        "replaces the position embeddings at INIT; at AFTER_DATALOADER splits causal sequences after "
        "sequence-length warmup has cut them"
    ),
    needs=frozenset({Capability.ALIBI}),
    sequence_limit="max_sequence_length",
    check=check,
)
