"""Everything a run knows at one moment, shared by the trainer, algorithms and callbacks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainrun.core.accounts import TimeAccounts
from trainrun.core.compiled import CompileRecord
from trainrun.core.distributed import Placement
from trainrun.core.precision import Precision
from trainrun.core.time import Timeline
from trainrun.quality import Quality

LossFunction = Callable[[Any, Any], torch.Tensor]  # (outputs, targets) -> the batch's loss


class RunEvaluator(Protocol):
    """One evaluation pass, as the trainer drives it (:class:`trainrun.tasks.base.Evaluator`)."""

    def update(self, outputs: Any, targets: Any) -> None: ...

    def compute(self) -> dict[str, float]: ...


class RunTask(Protocol):
    """What the loop asks of the run's task (:class:`trainrun.tasks.base.Task`): batches to inputs and
    targets on the device, an evaluation pass, and the metric time-to-quality is measured in."""

    quality: str
    metrics: Mapping[str, str]
    quality_rule: Quality

    def batch(self, batch: Any, state: State) -> tuple[Any, Any, int]: ...

    def loss_terms(self, targets: Any) -> torch.Tensor | None: ...

    def predict(self, model: nn.Module, inputs: Any) -> Any: ...

    def evaluator(self, state: State) -> RunEvaluator: ...


class RunData(Protocol):
    """What the loop and the methods ask of the run's data (:class:`trainrun.data.interface.DataSpec`)."""

    batches_per_epoch: int

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator: ...

    def eval_batches(self) -> Iterable: ...

    def add_train_transform(self, transform: Callable[[torch.Tensor], torch.Tensor]) -> bool: ...

    def set_train_resolution(self, size: int) -> bool: ...

    def unreadable_files(self) -> list[str]: ...

    def for_replica(self, replica: int) -> RunData: ...


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
    replica: int = 0  # launcher.fault_tolerance=replicas: this node's replica group of ``replicas``
    replicas: int = 1
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
    loss_fn: LossFunction | None = None
    task: RunTask | None = None
    data: RunData | None = None
    num_classes: int = 0
    memory_format: torch.memory_format = torch.contiguous_format  # of the model and its input batches
    train_resolution: int | None = None  # full training resolution; algorithms may train lower
    find_unused_parameters: bool = False  # DDP option for algorithms that stop some gradients
    # results
    train_loss: float | None = None  # last step's loss, updated every log_interval steps
    eval_metrics: dict[str, float] = field(default_factory=dict)
    accounts: TimeAccounts = field(default_factory=TimeAccounts)
    stop_reason: str | None = None  # why training ends before max_duration (e.g. target_reached)
    notices: list[dict[str, Any]] = field(default_factory=list)  # shown on the console, kept in summary.json
    unreadable_files: list[str] = field(default_factory=list)  # data files every rank's loaders skipped (at the end)
    compiled: CompileRecord | None = None  # under compile=true: graph breaks, recompiles, seconds
    faults: list[dict[str, Any]] = field(default_factory=list)  # fault_tolerance=replicas: nodes lost and joined

    def notice(self, text: str, level: str = "note") -> None:
        """Record something about the run a person must see: a ``note`` or a ``warning``."""
        self.notices.append({"step": self.batch, "level": level, "text": text})

    def warn(self, text: str) -> None:
        self.notice(text, "warning")

    @property
    def progress(self) -> float:
        """Fraction of the run done, 0 to 1 (of the time spent, for a budgeted run)."""
        return self.timeline.fraction(self.batch)

    @property
    def raw_model(self) -> nn.Module:
        """The model without its distributed wrapper and without torch.compile's."""
        model = self.model.module if isinstance(self.model, DistributedDataParallel) else self.model
        return getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule keeps the original here

    @property
    def placement(self) -> Placement:
        """This rank's place in the run (local rank aside)."""
        return Placement(self.rank, self.world_size, 0, self.replica, self.replicas)

    @property
    def is_main(self) -> bool:
        return self.placement.is_main

    @property
    def data_rank(self) -> int:  # what its random draws are keyed to
        return self.placement.data_rank

    @property
    def data_ranks(self) -> int:
        return self.placement.data_ranks
