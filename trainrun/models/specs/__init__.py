"""Each model's torch-free spec (:class:`trainrun.kinds.KindSpec`), one module per model module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from trainrun.errors import ConfigError
from trainrun.kinds import Capability, KindSpec


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


@contextlib.contextmanager
def refused_arguments(key: str, builder: str) -> Iterator[None]:
    """A brought model's builder refusing what the run gives it (an unknown keyword, a value it
    cannot take) as one line naming ``key`` and the builder's own first line."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as error:  # a builder of any library raises what it raises
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
        first = f"{type(error).__name__} {first}" if isinstance(error, KeyError) else first  # 'nope' alone says little
        raise ConfigError(f"bad value for '{key}': {builder} refuses it: {first}") from None


def found_capabilities(config: Any) -> frozenset[Capability]:
    """What a brought model offers, found in its build (:mod:`trainrun.models.found`, imported when asked)."""
    from trainrun.models.found import found_capabilities as found

    return found(config)


def weights_fit(config: Any) -> None:
    """``model.weights`` fits a brought model as built, before any process starts."""
    from trainrun.models.found import check_weights

    check_weights(config)


def brought_kind(name: str, builder: str, batches: str, check: Any, **more: Any) -> KindSpec:
    """The spec of a kind of model a user brings: what it offers is found in its build, and starting
    weights are checked against it (``more``: the spec's other fields)."""
    return KindSpec(
        name=name, builder=builder, batches=batches, check=check, finds=found_capabilities, check_files=weights_fit,
        **more,
    )  # fmt: skip
