"""The hyperparameters and spec of ``masked_head``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.kinds import Capability


@dataclass
class MaskedHeadConfig:
    """Masked-language models: the output head runs on the masked positions only."""


SPEC = MethodSpec(
    name="masked_head",
    config=MaskedHeadConfig,
    position=230,
    order_reason="switches the model's output head at INIT; no other method touches it",
    needs=frozenset({Capability.MASKED_HEAD}),
)
