"""Speed-up methods, one module each; a module's ``build`` turns its config into an Algorithm.

Hyperparameter dataclasses live in :mod:`trainrun.schema` (validated without importing torch);
the module of the same name here implements the method.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.schema import ALGORITHM_CONFIGS


class ModelSurgery(Algorithm):
    """A method that changes the model once, at INIT, before the optimizer and DDP see it.

    Subclasses set ``surgery = staticmethod(f)`` with ``f(model, config)``; ``order`` places them
    among each other. The class itself is the module's ``build``.
    """

    events = frozenset({Event.INIT})
    surgery: ClassVar[Any]

    def __init__(self, config: Any) -> None:
        self.config = config

    def apply(self, event: Event, state: State) -> None:
        self.surgery(state.raw_model, self.config)


def build_algorithms(configs: dict[str, Any]) -> list[Algorithm]:
    """One algorithm per configured name, from ``trainrun.algorithms.<name>.build``."""
    algorithms = []
    for name, config in configs.items():
        if name not in ALGORITHM_CONFIGS:
            raise KeyError(name)
        module = importlib.import_module(f"trainrun.algorithms.{name}")
        algorithms.append(module.build(config))
    return algorithms
