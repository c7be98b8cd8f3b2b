"""Every name a config may give a component, and the function that builds it.

One convention for every kind: the config's ``name`` (``model.name``, ``data.name``,
``task.name``, an entry of ``loggers``) is a key of :data:`BUILDERS`, whose value says where the
builder lives as ``module:function``. The table is torch-free, so validation and ``--help`` read
the names without importing a model; :func:`builder` imports the module when a run needs it.
Speed-up methods follow the same rule by file: ``algorithms/specs/<name>.py`` holds the spec and
``algorithms/<name>.py`` the method (:func:`trainrun.algorithms.method_class`).

What each kind's builder takes:

- ``task``: the :class:`~trainrun.schema.DataConfig` (what the batches hold: the image task's
  normalisation; ``None``: the schema's defaults); returns the :class:`~trainrun.tasks.Task`.
- ``model``: the :class:`~trainrun.schema.ModelConfig` and the data's vocabulary size (text);
  returns the initialised ``nn.Module``.
- ``data``: the :class:`~trainrun.schema.DataConfig`, the rank's placement and whether to augment;
  returns the training and validation datasets. ``beton`` is the one source that is files already
  in the FFCV loader's format: its builder returns the two paths.
- ``logger``: the run directory and the run's :class:`~trainrun.schema.TrainConfig`; returns a
  callback that rank 0 adds to the run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101")

BUILDERS: dict[str, dict[str, str]] = {
    "task": {
        "image_classification": "trainrun.tasks.image_classification:build",
        "masked_lm": "trainrun.tasks.masked_lm:build",
        "causal_lm": "trainrun.tasks.causal_lm:build",
        "segmentation": "trainrun.tasks.segmentation:build",
    },
    "model": {
        "resnet_small": "trainrun.models.small:build",
        **{name: "trainrun.models.resnet:build" for name in RESNETS},
        "bert": "trainrun.models.bert:build",
        "gpt": "trainrun.models.gpt:build",
        "unet": "trainrun.models.unet:build",
    },
    "data": {
        "digits": "trainrun.data.builtin:builtin_datasets",
        "mnist5k": "trainrun.data.builtin:builtin_datasets",
        "synthetic": "trainrun.data.builtin:synthetic_datasets",
        "folder": "trainrun.data.folder:folder_datasets",
        "beton": "trainrun.data.ffcv:beton_files",
        "text": "trainrun.data.masked_text:text_datasets",
        "token_stream": "trainrun.data.causal_text:stream_datasets",
        "synthetic_brats": "trainrun.data.segmentation:segmentation_datasets",
        "decathlon": "trainrun.data.segmentation:segmentation_datasets",
    },
    "logger": {
        "tensorboard": "trainrun.loggers.tensorboard:TensorBoardLogger",
        "mlflow": "trainrun.loggers.mlflow:MlflowLogger",
    },
}


def names(kind: str) -> tuple[str, ...]:
    """The names a config may give a component of ``kind``."""
    return tuple(BUILDERS[kind])


def builder(kind: str, name: str) -> Callable[..., Any]:
    """The function that builds the ``kind`` called ``name``."""
    module, _, function = BUILDERS[kind][name].partition(":")
    return getattr(importlib.import_module(module), function)
