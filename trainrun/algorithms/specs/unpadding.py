"""The hyperparameters and spec of ``unpadding``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.kinds import Capability


@dataclass
class UnpaddingConfig:
    """Masked-language models: no work on padding tokens outside attention."""


SPEC = MethodSpec(
    name="unpadding",
    config=UnpaddingConfig,
    position=220,
    order_reason="switches the model's forward at INIT; any layer surgery before or after applies within it",
    needs=frozenset({Capability.UNPADDING}),
)
