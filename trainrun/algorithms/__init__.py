"""Speed-up methods, one module each; a module's ``build`` turns its config into an Algorithm.

Hyperparameter dataclasses live in :mod:`trainrun.schema` (validated without importing torch);
the module of the same name here implements the method.
"""

from __future__ import annotations

import importlib
from typing import Any

from trainrun.core.engine import Algorithm
from trainrun.schema import ALGORITHM_CONFIGS


def build_algorithms(configs: dict[str, Any]) -> list[Algorithm]:
    """One algorithm per configured name, from ``trainrun.algorithms.<name>.build``."""
    algorithms = []
    for name, config in configs.items():
        if name not in ALGORITHM_CONFIGS:
            raise KeyError(name)
        module = importlib.import_module(f"trainrun.algorithms.{name}")
        algorithms.append(module.build(config))
    return algorithms


def order_markdown() -> str:
    """The order table and the order it resolves to at each event, as Markdown for the docs."""
    from trainrun.core.engine import Engine
    from trainrun.core.events import Event
    from trainrun.schema import ALGORITHM_ORDER

    engine = Engine(build_algorithms({name: config() for name, config in ALGORITHM_CONFIGS.items()}))
    events = {algorithm.name: algorithm.events for algorithm in engine.algorithms}
    lines = ["| # | method | acts on | why here |", "| --- | --- | --- | --- |"]
    for position, (name, why) in enumerate(ALGORITHM_ORDER, start=1):
        acts = ", ".join(event.name for event in Event if event in events[name])
        lines.append(f"| {position} | `{name}` | {acts} | {why} |")
    lines += ["", "| event | methods, in the order they run |", "| --- | --- |"]
    for event in Event:
        if order := engine.order_at(event):
            reversed_note = " (reversed: closes a bracket)" if event.closes else ""
            lines.append(f"| {event.name}{reversed_note} | {' → '.join(order)} |")
    return "\n".join(lines) + "\n"
