"""The settings of the loggers a run may add (``loggers=[mlflow, wandb]``), part of the run's
configuration (:class:`trainrun.schema.TrainConfig`'s ``mlflow`` and ``wandb``). Torch-free, as the
schema is."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainrun.fields import choice_field


@dataclass
class MlflowConfig:
    """Where ``loggers=[mlflow]`` logs (trainrun.loggers.mlflow)."""

    tracking_uri: str | None = None  # null: $MLFLOW_TRACKING_URI, else sqlite mlflow.db beside the run directory
    experiment: str = "trainrun"
    run_name: str | None = None  # null: the run directory's name


@dataclass
class WandbConfig:
    """Where ``loggers=[wandb]`` logs (trainrun.loggers.wandb); credentials are W&B's own
    (``WANDB_API_KEY`` or a netrc entry), never part of the config."""

    mode: str | None = choice_field(None, "online", "offline", "disabled")  # null: $WANDB_MODE, else online
    project: str = "trainrun"
    entity: str | None = None  # null: the credentials' default team or user
    tags: list[str] = field(default_factory=list)
    run_name: str | None = None  # null: the run directory's name
