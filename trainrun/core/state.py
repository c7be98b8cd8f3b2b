"""Everything a run knows at one moment, shared by the trainer, algorithms and callbacks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainrun.core.precision import Precision
from trainrun.core.time import Time, Timeline

BUCKETS = ("data", "to_device", "step", "algorithms", "eval", "checkpoint", "other")
UNTIMED_BUCKETS = ("eval", "checkpoint")  # excluded from training time, as the field reports it


class TimeAccounts:
    """Charges every second of a run to exactly one bucket.

    :meth:`switch` closes the running bucket and opens another, so buckets never overlap and
    their sum is the wall time since :meth:`start`.
    """

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(BUCKETS, 0.0)
        self.current = "other"
        self._since = time.perf_counter()

    def start(self, offset: dict[str, float] | None = None) -> None:
        """Begin timing now, continuing from ``offset`` (a resumed run's accounts)."""
        self.seconds = dict.fromkeys(BUCKETS, 0.0) | (offset or {})
        self.current = "other"
        self._since = time.perf_counter()

    def switch(self, bucket: str) -> str:
        """Charge the time since the last switch to the running bucket; return its name."""
        now = time.perf_counter()
        previous = self.current
        self.seconds[previous] += now - self._since
        self.current, self._since = bucket, now
        return previous

    def total(self) -> float:
        """Wall seconds so far, including the running bucket."""
        return sum(self.seconds.values()) + time.perf_counter() - self._since

    def train_seconds(self) -> float:
        """Wall seconds with evaluation and checkpointing excluded."""
        running = time.perf_counter() - self._since if self.current not in UNTIMED_BUCKETS else 0.0
        return sum(v for k, v in self.seconds.items() if k not in UNTIMED_BUCKETS) + running


@dataclass
class State:
    """The run's components and progress. Algorithms read and replace fields here."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None  # built by the trainer after INIT when None
    timeline: Timeline
    device: torch.device
    precision: Precision  # autocast and, for fp16, the gradient scaler
    rank: int = 0
    world_size: int = 1
    # progress (batch counts optimizer steps over the whole run)
    epoch: int = 0
    batch: int = 0
    batch_in_epoch: int = 0
    samples: int = 0
    # the current step
    inputs: Any = None
    targets: Any = None
    outputs: Any = None
    loss: Any = None
    loss_fn: Any = None
    data: Any = None  # the run's DataSpec
    num_classes: int = 0
    train_resolution: int | None = None  # full training resolution; algorithms may train lower
    find_unused_parameters: bool = False  # DDP option for algorithms that stop some gradients
    # results
    train_loss: float | None = None  # last step's loss, updated every log_interval steps
    eval_metrics: dict[str, float] = field(default_factory=dict)
    accounts: TimeAccounts = field(default_factory=TimeAccounts)
    stop_reason: str | None = None

    @property
    def progress(self) -> float:
        """Fraction of the run done, 0 to 1."""
        return self.batch / self.timeline.max_batches

    def elapsed(self, time_: Time | str) -> bool:
        """Whether at least ``time_`` of training has passed."""
        return self.batch >= self.timeline.to_batches(time_)

    @property
    def raw_model(self) -> nn.Module:
        """The model without its distributed wrapper and without torch.compile's."""
        model = self.model.module if isinstance(self.model, DistributedDataParallel) else self.model
        return getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule keeps the original here

    @property
    def is_main(self) -> bool:
        """Rank 0, the one that owns the console and every file."""
        return self.rank == 0
