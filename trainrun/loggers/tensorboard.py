"""TensorBoard scalars with ``torch.utils.tensorboard``: what ``metrics.jsonl`` and ``steps.jsonl`` hold.

Rank 0 writes one events file into the run directory. Every ``log_interval`` steps the learning
rate (``train/lr``); at each evaluation every evaluation metric under ``eval/`` with the mean
training loss and throughput since the previous one (``train/loss``, ``train/throughput``); at
the end the run's seconds per time bucket (``time/<bucket>``). The x-axis is the optimizer step.
Reading the loss per step would synchronise the device every step; trainrun reads it in batches.
"""

from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from trainrun.core.engine import Callback
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.schema import TrainConfig


class TensorBoardLogger(Callback):
    def __init__(self, run_dir: Path, config: TrainConfig) -> None:
        self.run_dir, self.log_interval = run_dir, config.log_interval
        self.writer: SummaryWriter | None = None

    def run_event(self, event: Event, state: State) -> None:
        if not state.is_main:
            return
        if event is Event.FIT_START:
            self.writer = SummaryWriter(log_dir=str(self.run_dir))
        elif event is Event.BATCH_END and state.batch % self.log_interval == 0:
            self.writer.add_scalar("train/lr", state.optimizer.param_groups[0]["lr"], state.batch)
        elif event is Event.EVAL_END:
            metrics = dict(state.eval_metrics)
            self.writer.add_scalar("train/loss", metrics.pop("train_loss"), state.batch)
            self.writer.add_scalar("train/throughput", metrics.pop("throughput"), state.batch)
            for name, value in metrics.items():
                self.writer.add_scalar(f"eval/{name}", value, state.batch)
            self.writer.flush()
        elif event is Event.FIT_END:
            for bucket, seconds in state.accounts.seconds.items():
                self.writer.add_scalar(f"time/{bucket}", seconds, state.batch)
            self.writer.close()
