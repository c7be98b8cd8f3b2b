"""The FLOPs a run's step and its evaluations count, at each size its phases train and evaluate at,
and the share of the GPU's peak their operations reach there (:mod:`trainrun.estimate.device`),
each found once a size on the model as the run builds it (:mod:`trainrun.estimate.memory`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from trainrun.core.work import StepWork
from trainrun.data.interface import TextFacts
from trainrun.estimate.device import SEVERAL_GROUPS, Device, Gpus
from trainrun.schema import TrainConfig
from trainrun.tasks.base import Task

COUNTED_SIZES = 6  # more distinct sizes than this: FLOPs counted at three, fitted by a quadratic in the size


class FlopCounts:
    """FLOPs a sample of the run at each size a phase trains (or an evaluation forwards) at, and the
    share of its GPU's peak a micro-batch's operations reach there (its MFU), each found once a size
    (fitted where there are many: a quadratic in the side or length is exact for FLOPs of
    convolutions and attention)."""

    def __init__(
        self,
        config: TrainConfig,
        task: Task,
        text: TextFacts | None,
        samples: int,
        micro_batch: int,
        checkpointing: str,
        eval_micro_batch: int,
    ) -> None:
        self.config, self.task, self.text, self.samples, self.micro_batch = config, task, text, samples, micro_batch
        self.checkpointing = checkpointing
        # an evaluation forward's samples: a micro-batch of the evaluation's, or a pass of sliding windows
        self.eval_micro_batch = getattr(task, "window_batch", eval_micro_batch)
        self.counted: dict[tuple, float] = {}
        self.utilisations: dict[tuple, float] = {}
        self.several_groups: dict[tuple, float] = {}  # depthwise and grouped convolutions' share of the time

    def sized(self, resolution: int | None, length: int | None) -> tuple[TrainConfig, TextFacts | None]:
        """The run's config and text at ``resolution`` or ``length`` (None: as the run sets it)."""
        config, text = self.config, self.text
        if resolution is not None:
            config = dataclasses.replace(config, data=dataclasses.replace(config.data, resolution=resolution))
        if length is not None:
            text = dataclasses.replace(text, max_seq_len=length)
        return config, text

    def counted_at(self, resolution: int | None, length: int | None, train: bool = True) -> float:
        from trainrun.estimate.memory import pass_flops

        key = (resolution, length, train)
        if key not in self.counted:
            config, text = self.sized(resolution, length)
            self.counted[key] = pass_flops(config, self.task, text, self.samples, train) / self.samples
        return self.counted[key]

    def utilisation_at(self, resolution: int | None, length: int | None, device: Device, train: bool = True) -> float:
        """The share of ``device``'s peak a training micro-batch (``train`` false: an evaluation
        forward's) at ``resolution`` or ``length`` reaches: its model FLOPs over its operations' time
        there (recompute included)."""
        from trainrun.estimate.memory import pass_operations

        key = (resolution, length, device, train)
        if key not in self.utilisations:
            config, text = self.sized(resolution, length)
            samples, checkpointing = (
                (self.micro_batch, self.checkpointing) if train else (self.eval_micro_batch, "none")
            )
            operations = pass_operations(config, self.task, text, samples, checkpointing, train)
            model_flops = self.counted_at(resolution, length, train) * samples
            self.utilisations[key] = device.utilisation(operations, model_flops)
            if train:
                self.several_groups[key] = device.share_in(operations, SEVERAL_GROUPS)
        return self.utilisations[key]

    def training(self, works: list[StepWork]) -> list[float]:
        """Forward-and-backward FLOPs a sample for each of ``works``."""
        return self.by_size(works, self.counted_at)

    def utilisation(self, works: list[StepWork], device: Device) -> list[float]:
        """The share of ``device``'s peak each of ``works`` reaches."""
        return self.by_size(works, lambda resolution, length: self.utilisation_at(resolution, length, device))

    def evaluation_seconds(
        self, flops: float, size: tuple[int | None, int | None], gpus: Gpus, ranks: int, step_share: float
    ) -> float | None:
        """An evaluation's ``flops`` on ``ranks`` of ``gpus``: at the share its forward's operations at
        ``size`` reach, or at ``step_share`` where the share is stated (``--mfu``) or not timed."""
        timed = flops and gpus.device is not None and gpus.basis != "stated"
        share = self.utilisation_at(*size, gpus.device, train=False) if timed else step_share
        return gpus.compute_seconds(flops, ranks, share) if share else None

    @staticmethod
    def by_size(works: list[StepWork], found: Callable[[int | None, int | None], float]) -> list[float]:
        """``found`` at each of ``works``' sizes, or at three of many and fitted by a quadratic in the size."""
        sizes = sorted(
            {(work.resolution, work.sequence_length) for work in works}, key=lambda size: size[0] or size[1] or 0
        )
        if len(sizes) <= COUNTED_SIZES:
            return [found(work.resolution, work.sequence_length) for work in works]
        ends = [sizes[0], sizes[len(sizes) // 2], sizes[-1]]
        side = 0 if sizes[0][0] is not None else 1
        fit = np.polyfit([size[side] for size in ends], [found(*size) for size in ends], 2)
        return [float(np.polyval(fit, (work.resolution, work.sequence_length)[side])) for work in works]


def step_flops(work: StepWork, per_sample: float, batch: int) -> float:
    """A step's FLOPs (all ranks) under ``work``: its trained samples forward and backward (again for a
    second pass), its scoring forwards at a third of that, at the share of pixels kept."""
    trained = work.trained_share * (1 + work.extra_passes)
    return batch * work.pixel_share * per_sample * (trained + work.scored_share / 3)


def evaluation_flops(
    config: TrainConfig, task: Task, counts: FlopCounts, images: bool, case_shape: list[int] | None, notes: list[str]
) -> tuple[float, tuple[int | None, int | None]]:
    """One evaluation's FLOPs (all ranks) and the resolution or length its forwards run at: the
    validation samples at the evaluation's resolution, or each case's windows (segmentation); 0 where
    the validation set's size is not said."""
    if len(config.data.samples) < 2 and not config.data.text.val_tokens:
        notes.append("evaluation not counted: its size is not said (data.samples=[TRAIN,VAL])")
        return 0.0, (None, None)
    if hasattr(task, "windows_a_case"):
        if case_shape is None:
            notes.append("evaluation not counted: whole cases' windows need their shape (--case-shape D H W)")
            return 0.0, (None, None)
        windows = config.data.samples[1] * task.windows_a_case(case_shape)
        return windows * counts.counted_at(None, None, train=False), (None, None)
    if config.data.samples:
        side = config.data.eval_resolution if images else None
        return config.data.samples[1] * counts.counted_at(side, None, train=False), (side, None)
    length = counts.text.max_seq_len
    return config.data.text.val_tokens / length * counts.counted_at(None, length, train=False), (None, length)
