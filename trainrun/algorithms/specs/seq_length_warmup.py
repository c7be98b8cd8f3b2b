"""The hyperparameters and spec of ``seq_length_warmup``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import positive_field, positive_fraction_field
from trainrun.kinds import Capability


@dataclass
class SeqLengthWarmupConfig:
    """Train on sequences cut short, growing linearly to full length (Li et al. 2021; Composer's schedule)."""

    duration: float = positive_fraction_field(0.3)  # fraction of the run it grows over
    min_seq_length: int = positive_field(8)
    max_seq_length: int = positive_field(1024)  # capped at the batch's own length
    step_size: int = positive_field(8)  # lengths are min_seq_length plus multiples of this


SPEC = MethodSpec(
    name="seq_length_warmup",
    config=SeqLengthWarmupConfig,
    position=90,
    order_reason="shortens the batch's sequences before anything reads their positions",
    needs=frozenset({Capability.SEQUENCES}),
    varying_step_cost=True,
)
