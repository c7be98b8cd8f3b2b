"""Progressive resizing: train at a reduced resolution that grows linearly to full size.

scale(t) = s0 + (1 − s0) · clip((t − delay) / (1 − finetune − delay), 0, 1), with t the fraction
of training done; the side is ``scale · full`` rounded to the nearest multiple of ``size_increment``
(Python's ``round``, as Composer's implementation rounds it).
When the loader can decode at a given size (FFCV), the size is set at each EPOCH_START and
images are decoded at it (unless ``loader_decodes`` is false, as Composer's runs: the loader's
work then stays at full size); otherwise each training batch is resized on the device at
AFTER_DATALOADER (``resize``: nearest-neighbour, as Composer; ``crop``: one random crop per batch).
Evaluation always runs at full resolution.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from trainrun.algorithms.base import TrainingResolution
from trainrun.algorithms.specs.progressive_resizing import ProgressiveResizingConfig
from trainrun.core.state import State
from trainrun.core.work import StepWork


def scale_at(progress: float, initial_scale: float, delay: float, finetune: float) -> float:
    """The fraction of full resolution to train at after ``progress`` of the run."""
    ramp = 1.0 - finetune - delay
    fraction = 1.0 if ramp <= 0 else min(max((progress - delay) / ramp, 0.0), 1.0)
    return initial_scale + (1.0 - initial_scale) * fraction


def size_at(progress: float, full: int, config: ProgressiveResizingConfig) -> int:
    """Training side length after ``progress`` of the run."""
    scale = scale_at(progress, config.initial_scale, config.delay, config.finetune)
    size = round(full * scale / config.size_increment) * config.size_increment  # nearest multiple, as Composer
    return min(max(size, config.size_increment), full)


class ProgressiveResizing(TrainingResolution):
    name = "progressive_resizing"

    def __init__(self, config: ProgressiveResizingConfig) -> None:
        self.config = config

    @property
    def loader_decodes(self) -> bool:
        return self.config.loader_decodes

    def target_size(self, state: State) -> int:
        return size_at(state.progress, state.train_resolution, self.config)

    def step_work(self, work: StepWork, progress: float) -> StepWork:
        side = size_at(progress, work.full_resolution, self.config)
        loaded = None if self.loader_decodes else work.full_resolution
        return dataclasses.replace(work, resolution=side, loaded_resolution=loaded)

    def shrink(self, images: torch.Tensor, size: int) -> torch.Tensor:
        """Resize (nearest) or crop a batch to ``size`` x ``size``."""
        if self.config.mode == "resize":
            return F.interpolate(images, size=(size, size), mode="nearest")
        top = int(torch.randint(0, images.shape[-2] - size + 1, ()))
        left = int(torch.randint(0, images.shape[-1] - size + 1, ()))
        return images[..., top : top + size, left : left + size]
