"""The hyperparameters and spec of ``cutmix``."""

from __future__ import annotations

from dataclasses import dataclass

from trainrun.algorithms.specs import MethodSpec
from trainrun.fields import positive_field
from trainrun.kinds import Capability


@dataclass
class CutMixConfig:
    """A box of one image pasted into another, labels mixed by area (torchvision's CutMix)."""

    alpha: float = positive_field(1.0)


SPEC = MethodSpec(
    name="cutmix",
    config=CutMixConfig,
    position=110,
    order_reason="as mixup",
    incompatible={"mixup": "both replace each batch with mixed images and targets; choose one"},
    needs=frozenset({Capability.CLASS_IMAGES}),
)
