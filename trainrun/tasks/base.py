"""Tasks: what is specific to a kind of problem, so that nothing else is.

A task turns a loader's batch into model inputs and targets on the device, names the losses a
run can choose, evaluates (metrics reduced over ranks), and says which metric is the run's
*quality*, the one time-to-quality is measured in. The trainer, checkpoints, loggers, reports,
sweeps and bottleneck accounting speak only through it. ``conf/task/<name>.yaml`` selects it by
name from :mod:`trainrun.registry`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from trainrun.core.microbatches import take
from trainrun.core.state import LossFunction, State
from trainrun.kinds import task_spec
from trainrun.quality import Quality
from trainrun.registry import builder
from trainrun.schema import DataConfig


@dataclass
class BatchPlace:
    """What a task's ``batch`` reads of the state: where the batch goes and in which memory format (a
    batch made outside a run: trainrun estimate's fake rank, a brought model's check on the meta device)."""

    device: torch.device
    memory_format: torch.memory_format = torch.contiguous_format


class Evaluator(ABC):
    """Accumulates one evaluation pass; :meth:`compute` reduces over ranks."""

    @abstractmethod
    def update(self, outputs: Any, targets: Any) -> None:
        """Add one evaluation batch."""

    @abstractmethod
    def compute(self) -> dict[str, float]:
        """Every metric of the pass over all ranks' batches, ``eval_loss`` among them."""


class Task(ABC):
    """One kind of problem. ``metrics`` maps each evaluation metric (a fraction) to its label for
    people; ``eval_loss`` comes with every evaluation besides them."""

    name: ClassVar[str]  # the task's registered name: its spec (trainrun/tasks/specs/) says the rest
    metrics: ClassVar[dict[str, str]]
    unit: ClassVar[str]  # what one sample is called in throughputs ("img" for images/s)
    # whether a compiled run compiles the loss too (trainrun/core/compiled.py): one that traces whole
    loss_compiles: ClassVar[bool] = False

    @property
    def quality_rule(self) -> Quality:
        """The quality metric with its direction and display, as the task's spec declares it: what
        targets, stop_at and reports compare by."""
        return task_spec(self.name).quality

    @property
    def quality(self) -> str:
        """The metric accuracy targets, stop-at-target and reports use."""
        return self.quality_rule.metric

    @abstractmethod
    def batch(self, batch: Any, state: State) -> tuple[Any, Any, int]:
        """A loader's batch as (model inputs, targets), both on ``state.device``, and its sample count."""

    def predict(self, model: torch.nn.Module, inputs: Any) -> Any:
        """The model's outputs for an evaluation batch's ``inputs`` (a task whose samples do not fit
        one forward pass, such as whole volumes, runs several)."""
        return model(inputs)

    def without_repeats(self, outputs: Any, targets: Any, scored: int, size: int) -> tuple[Any, Any]:
        """An evaluation pass's outputs and targets for its first ``scored`` of ``size`` samples: the
        rest repeat a sample so that every rank runs the same passes, and are not scored. Outputs
        with a row per sample are cut (tensors, dicts, lists of whole volumes)."""
        if isinstance(outputs, list):
            return outputs[:scored], targets[:scored]
        kept = slice(0, scored)
        return take(outputs, kept, size), take(targets, kept, size)

    @abstractmethod
    def loss(self, name: str) -> LossFunction:
        """The training loss called ``name`` in the config."""

    def loss_terms(self, targets: Any) -> torch.Tensor | None:
        """How many terms the loss of ``targets`` averages, on the device, where that varies from
        batch to batch (the predicted tokens of a language model); None: one term per sample.

        The trainer weighs each rank's and micro-batch's mean loss by its share of the step's terms
        over all ranks, so that the step's loss is the mean over all of them, whatever the split.
        """
        return None

    @abstractmethod
    def evaluator(self, state: State) -> Evaluator:
        """A fresh accumulator for one evaluation pass of ``state``'s run."""

    def startup_notes(self, state: State) -> list[str]:
        """Lines for the start-up banner about how this run will execute (kernels chosen, ...)."""
        return []

    def export(self, state: State, run_dir: Path) -> list[str]:
        """Write the trained model in its ecosystem's own format under ``run_dir``, if the task has
        one; return lines for the console (what was written, what it leaves out)."""
        return []


class SequenceTask(Task):
    """A task whose samples are token sequences that a method may cut short (sequence-length
    warmup, ALiBi's shorter training sequences)."""

    @abstractmethod
    def sequence_length(self, inputs: Any) -> int:
        """The batch's tokens per sequence."""

    @abstractmethod
    def truncate(self, inputs: Any, targets: Any, length: int) -> tuple[Any, Any]:
        """The batch with every sequence cut to its first ``length`` tokens."""


def token_loss_metrics(loss_sum: float, tokens: float) -> dict[str, float]:
    """``eval_loss`` (mean cross-entropy per scored token) and its exponential, ``perplexity``
    (infinite from a mean of 50 on rather than overflowing); NaN for no tokens."""
    mean = loss_sum / tokens if tokens else float("nan")
    return {"eval_loss": mean, "perplexity": math.exp(mean) if mean < 50 else float("inf")}


def build_task(name: str, data: DataConfig | None = None) -> Task:
    """The task ``task.name`` names (:mod:`trainrun.registry`), for data read as ``data`` says."""
    return builder("task", name)(data)
