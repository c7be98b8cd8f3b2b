"""Speed-up methods, one module each: ``<name>.py`` defines the method, an :class:`Algorithm`
whose ``name`` is ``<name>``, built from its config as ``Method(config)``.

Each method's hyperparameters and facts live in ``specs/<name>.py`` (validated without importing
torch: nothing here imports it at package import).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from trainrun.algorithms.specs import METHOD_ORDER, SPECS

if TYPE_CHECKING:
    from trainrun.core.engine import Algorithm


def in_method_order(algorithms: Iterable[Algorithm]) -> list[Algorithm]:
    """``algorithms`` in the order the engine runs them (each spec's ``position``)."""
    return sorted(algorithms, key=lambda algorithm: METHOD_ORDER.index(algorithm.name))


def method_class(name: str) -> type[Algorithm]:
    """The :class:`Algorithm` of ``trainrun.algorithms.<name>`` whose ``name`` is ``name``."""
    from trainrun.core.engine import Algorithm

    if name not in SPECS:
        raise KeyError(name)
    module = importlib.import_module(f"trainrun.algorithms.{name}")
    (method,) = (
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, Algorithm) and getattr(value, "name", None) == name
    )
    return method


def build_algorithms(configs: dict[str, Any]) -> list[Algorithm]:
    """One algorithm per configured name, built from its config, in method order."""
    return in_method_order(method_class(name)(config) for name, config in configs.items())


def order_markdown() -> str:
    """The order of the specs and the order it resolves to at each event, as Markdown for the docs."""
    from trainrun.core.engine import Engine
    from trainrun.core.events import Event

    engine = Engine(build_algorithms({name: spec.config() for name, spec in SPECS.items()}))
    events = {algorithm.name: algorithm.events for algorithm in engine.algorithms}
    lines = ["| # | method | acts on | why here |", "| --- | --- | --- | --- |"]
    for position, (name, spec) in enumerate(SPECS.items(), start=1):
        acts = ", ".join(event.name for event in Event if event in events[name])
        lines.append(f"| {position} | `{name}` | {acts} | {spec.order_reason} |")
    lines += ["", "| event | methods, in the order they run |", "| --- | --- |"]
    for event in Event:
        if order := engine.order_at(event):
            reversed_note = " (reversed: closes a bracket)" if event.closes else ""
            lines.append(f"| {event.name}{reversed_note} | {' → '.join(order)} |")
    return "\n".join(lines) + "\n"
