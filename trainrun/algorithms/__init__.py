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
