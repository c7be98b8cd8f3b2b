"""The hyperparameters and spec of ``trivialaugment``."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainrun.algorithms.specs import MethodSpec
from trainrun.kinds import Capability


@dataclass
class TrivialAugmentConfig:
    """One random operation at a random strength per training image (TrivialAugment Wide)."""

    num_magnitude_bins: int = field(default=31, metadata={"min": 2})


SPEC = MethodSpec(
    name="trivialaugment",
    config=TrivialAugmentConfig,
    position=130,
    order_reason="as randaugment",
    torch_loader_only=True,
    incompatible={"randaugment": "both draw random per-image augmentations; choose one"},
    needs=frozenset({Capability.CLASS_IMAGES}),
)
