"""The hyperparameters and spec of ``colout``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import fraction_field
from trainrun.kinds import Capability


@dataclass
class ColOutConfig:
    """Drop random rows and columns of each training image (Composer's ColOut)."""

    p_row: float = fraction_field(0.15)
    p_col: float = fraction_field(0.15)
    batch: bool = True  # the same rows and columns for the whole batch


SPEC = MethodSpec(
    name="colout",
    config=ColOutConfig,
    position=70,
    order_reason="after the batch has its size for the step",
    needs=frozenset({Capability.CLASS_IMAGES}),
)
