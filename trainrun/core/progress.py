"""What a run continues from: a checkpoint's payload, and a node that joins a fault-tolerant run's.

No per-rank state is kept (each step's draws are keyed to (seed, step, data rank); the samples' order
and augmentation to (seed, epoch) and the sample), so a payload continues on any number of ranks that
divides its global batch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

from trainrun.core import checkpoint
from trainrun.core.accounts import train_seconds
from trainrun.core.state import State


@dataclass
class Window:
    """Training figures since the last evaluation, reported with it."""

    loss_sum: float = 0.0
    loss_count: int = 0
    samples: int = 0
    started: float = 0.0  # training seconds when the window opened


PROGRESS = ("epoch", "batch", "batch_in_epoch", "samples")


class Trainer(Protocol):
    """What a payload is made from and restored to (:class:`trainrun.core.trainer.Trainer`)."""

    state: State
    scheduler: Any
    engine: Any
    settings: Any
    model_source: Any
    window: Window


def payload(trainer: Trainer, window: Window, weights: bool = True) -> dict[str, Any]:
    """The trainer's state with ``window``'s losses; without ``weights``, less the model and
    optimizer state (a sharded checkpoint's ranks write theirs themselves)."""
    state = trainer.state
    kept = {"model": state.raw_model.state_dict(), "optimizer": state.optimizer.state_dict()} if weights else {}
    return kept | {
        "format": checkpoint.FORMAT,
        "scheduler": trainer.scheduler.state_dict(),
        "scaler": state.precision.scaler.state_dict() if state.precision.scaler else None,
        "algorithms": trainer.engine.state_dict(),
        "progress": {key: getattr(state, key) for key in PROGRESS},
        "topology": {"world_size": state.data_ranks, "global_batch": state.timeline.samples_per_batch},
        "timeline": state.timeline.state_dict() if trainer.settings.budget else None,  # a budgeted run's plan
        "accounts": state.accounts.state_dict(),
        "window": asdict(window),
        "model_source": trainer.model_source,
    }


def restore(trainer: Trainer, saved: dict[str, Any]) -> dict[str, Any]:
    """Everything of ``saved`` but the weights and optimizer state (in place already); the
    algorithms' states, which the trainer restores once each has built what it keeps."""
    state = trainer.state
    trainer.scheduler.load_state_dict(saved["scheduler"])
    if state.precision.scaler and saved["scaler"]:
        state.precision.scaler.load_state_dict(saved["scaler"])
    if change := checkpoint.changed_source(saved.get("model_source"), trainer.model_source):
        state.warn(change)
    for key, value in saved["progress"].items():
        setattr(state, key, value)
    if trainer.settings.budget and saved.get("timeline"):
        state.timeline.load_state_dict(saved["timeline"])
        trainer.settings.budget.resume(state, train_seconds(saved["accounts"]["wall"]))
    window = Window(**saved["window"])
    if not state.is_main:  # the saved losses are every rank's: counted once, by the first rank
        window.loss_sum, window.loss_count = 0.0, 0
    trainer.window = window
    return saved["algorithms"]
