"""The spec of ``task=image_classification``: class-labelled images, top-1 as quality."""

from __future__ import annotations

from typing import Any

from trainrun.errors import ConfigError
from trainrun.kinds import Capability, TaskSpec
from trainrun.quality import TOP1


def check(config: Any) -> None:
    """One output per class of the data, and normalisation per colour channel."""
    if config.model.num_classes != config.data.num_classes:
        raise ConfigError(
            f"bad value for 'model.num_classes': {config.model.num_classes} but data "
            f"'{config.data.name}' has {config.data.num_classes} classes"
        )
    if len(config.data.mean) != 3 or len(config.data.std) != 3:
        raise ConfigError("bad value for 'data.mean'/'data.std': give three values (R, G, B)")


SPECS = (
    TaskSpec(
        name="image_classification",
        builder="trainrun.tasks.image_classification:build",
        batches="images",
        offers=frozenset({Capability.CLASS_IMAGES}),
        check=check,
        quality=TOP1,
        losses=("soft_ce", "bce"),
    ),
)
