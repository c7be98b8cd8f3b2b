"""The hyperparameters and spec of ``alibi``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import positive_field, positive_fraction_field


@dataclass
class AlibiConfig:
    """Attention biased by distance instead of learned position embeddings (Press et al. 2021)."""

    max_sequence_length: int = positive_field(1024)  # the longest sequence the model will accept
    # causal tasks: training sequences split into pieces of this share of their length (Composer's GPT: 0.25)
    train_sequence_length_scaling: float = positive_fraction_field(1.0)


SPEC = MethodSpec(
    name="alibi",
    config=AlibiConfig,
    position=210,
    order_reason=(
        "replaces the position embeddings at INIT; at AFTER_DATALOADER splits causal sequences after "
        "sequence-length warmup has cut them"
    ),
    tasks=("masked_lm", "causal_lm"),
    sequence_limit="max_sequence_length",
)
