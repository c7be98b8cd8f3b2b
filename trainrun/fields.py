"""Config fields with the checks OmegaConf cannot express, written in their metadata.

``time`` (a :class:`~trainrun.core.time.Time` string), ``interval`` (a recurring time, never zero),
``choices``, ``min``, ``max``, ``exclusive_min``, ``exclusive_max`` (of a number, or of each number of
a list) and ``length`` (of a list); :func:`trainrun.validation.check_fields` reads them. Torch-free,
like every config dataclass, so that a bad value fails in a fraction of a second.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import field, fields
from typing import Any


def time_field(default: str | None) -> Any:
    """A point or length of training time in any unit (``90ep``, ``100ba``, ``0.5dur``)."""
    return field(default=default, metadata={"time": True})


def interval_field(default: str | None) -> Any:
    """A time between recurring events: zero would never fire."""
    return field(default=default, metadata={"time": True, "interval": True})


def choice_field(default: str, *choices: str) -> Any:
    return field(default=default, metadata={"choices": choices})


def choices_of(config: type, name: str) -> tuple[str, ...]:
    """The choices of ``config``'s field ``name`` (a :func:`choice_field`): for a command's flag."""
    return next(spec.metadata["choices"] for spec in fields(config) if spec.name == name)


def positive_field(default: Any) -> Any:
    return field(default=default, metadata={"exclusive_min": 0})


def non_negative_field(default: Any) -> Any:
    return field(default=default, metadata={"min": 0})


def fraction_field(default: float) -> Any:
    """A share in [0, 1]."""
    return field(default=default, metadata={"min": 0, "max": 1})


def coefficient_field(default: float) -> Any:
    """A decay coefficient in [0, 1) (a momentum): at 1 nothing would decay, above it the sum grows."""
    return field(default=default, metadata={"min": 0, "exclusive_max": 1})


def coefficients_field(*defaults: float) -> Any:
    """A list of decay coefficients, each in [0, 1), as many as ``defaults`` (Adam's betas)."""
    bounds = {"min": 0, "exclusive_max": 1, "length": len(defaults)}
    return field(default_factory=lambda: list(defaults), metadata=bounds)


def open_fraction_field(default: float) -> Any:
    """A share in (0, 1): both parts non-empty (a held-out share)."""
    return field(default=default, metadata={"exclusive_min": 0, "exclusive_max": 1})


def positive_fraction_field(default: float) -> Any:
    """A share in (0, 1]."""
    return field(default=default, metadata={"exclusive_min": 0, "max": 1})


def list_keys(cls: type, prefix: str = "") -> set[str]:
    """Dotted keys of the dataclass ``cls`` whose value is a list, for flag translation."""
    keys = set()
    for name, hint in typing.get_type_hints(cls).items():
        if typing.get_origin(hint) is list:
            keys.add(prefix + name)
        elif dataclasses.is_dataclass(hint):
            keys |= list_keys(hint, f"{prefix}{name}.")
    return keys
