"""Every name a config may give a component, and the function that builds it.

One convention for every kind: the config's ``name`` (``model.name``, ``data.name``,
``task.name``, an entry of ``loggers``) names a builder, written as ``module:function``. Tasks,
models and data sources say theirs in their specs (:mod:`trainrun.kinds`); the loggers are listed
here. Both are torch-free, so validation and ``--help`` read the names without importing a model;
:func:`builder` imports the module when a run needs it. Speed-up methods follow the same rule by
file: ``algorithms/specs/<name>.py`` holds the spec and ``algorithms/<name>.py`` the method
(:func:`trainrun.algorithms.method_class`).

What each kind's builder takes:

- ``task``: the :class:`~trainrun.schema.DataConfig` (what the batches hold: the image task's
  normalisation; ``None``: the schema's defaults); returns the :class:`~trainrun.tasks.base.Task`.
- ``model``: the :class:`~trainrun.schema.ModelConfig` and the data's text facts (a vocabulary, a
  separator); returns the initialised ``nn.Module``.
- ``data``: the :class:`~trainrun.schema.DataConfig`, the rank's placement and whether to augment;
  returns the training and validation datasets. A source whose files are already in the FFCV
  loader's format returns the two paths.
- ``logger``: the run directory and the run's :class:`~trainrun.schema.TrainConfig`; returns a
  callback that rank 0 adds to the run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from trainrun import kinds

LOGGERS = {
    "tensorboard": "trainrun.loggers.tensorboard:TensorBoardLogger",
    "mlflow": "trainrun.loggers.mlflow:MlflowLogger",
    "wandb": "trainrun.loggers.wandb:WandbLogger",
}
KINDS = ("task", "model", "data", "logger")


def names(kind: str) -> tuple[str, ...]:
    """The names a config may give a component of ``kind``."""
    return tuple(LOGGERS) if kind == "logger" else kinds.names(kind)


def builder(kind: str, name: str) -> Callable[..., Any]:
    """The function that builds the ``kind`` called ``name``."""
    path = LOGGERS[name] if kind == "logger" else kinds.specs(kind)[name].builder
    module, _, function = path.partition(":")
    return getattr(importlib.import_module(module), function)
