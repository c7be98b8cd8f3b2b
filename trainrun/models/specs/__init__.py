"""Each model's torch-free spec (:class:`trainrun.kinds.KindSpec`), one module per model module."""

from __future__ import annotations

from typing import Any

from trainrun.errors import ConfigError


def refuse_initializers(config: Any, scheme: str) -> None:
    """For a model that initialises itself (``scheme``): ``model.initializers`` set to anything but
    its default would change nothing, so it is refused naming the key."""
    from trainrun.schema import INITIALIZERS  # the schema reads the model specs' names when it is built

    if list(config.model.initializers) != list(INITIALIZERS):
        raise ConfigError(
            f"bad value for 'model.initializers': {list(config.model.initializers)} (model={config.model.name} "
            f"initialises its own weights: {scheme}; the initializers apply to the ResNets)"
        )


def check_even_heads(kind: str, width: int, heads: int) -> None:
    """Rotary positions turn pairs of a head's dimensions: ``model.<kind>.heads`` must split the
    width into heads of an even size."""
    if width % heads or (width // heads) % 2:
        raise ConfigError(
            f"bad value for 'model.{kind}.heads': {heads} heads do not split model.{kind}.width {width} "
            "into heads of an even size"
        )
