"""FixRes-style training: train at a lower resolution than the evaluation uses.

Touvron et al. (2019) show that random-resized crops make objects look larger in training than
center crops do at test, so training at e.g. 176 px and testing at 224 px (resize 232) is both
cheaper and more accurate. The evaluation side is the data's ``eval_resolution`` /
``eval_resize``; this method sets the training side. At INIT the run's full training resolution
becomes ``train_resolution`` (progressive resizing then ramps up to it); at each EPOCH_START the
loader is asked to decode at that size, and where it cannot, each training batch is resized on
the device (bilinear, antialiased) at AFTER_DATALOADER. The paper's optional fine-tuning at the
test resolution is left out: the published recipes do not use it.
"""

import dataclasses

import torch
import torch.nn.functional as F

from trainrun.algorithms.base import TrainingResolution
from trainrun.algorithms.specs.fixres import FixResConfig
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.core.work import StepWork


class FixRes(TrainingResolution):
    name = "fixres"
    events = frozenset({Event.INIT, *TrainingResolution.events})
    config: FixResConfig

    def match(self, event: Event, state: State) -> bool:
        return event is Event.INIT or super().match(event, state)

    def apply(self, event: Event, state: State) -> None:
        if event is Event.INIT:
            state.train_resolution = self.config.train_resolution
        else:
            super().apply(event, state)

    def target_size(self, state: State) -> int:
        return self.config.train_resolution

    def step_work(self, work: StepWork, progress: float) -> StepWork:
        side = self.config.train_resolution
        return dataclasses.replace(work, full_resolution=side, resolution=side)

    def shrink(self, images: torch.Tensor, size: int) -> torch.Tensor:
        return F.interpolate(images, size=(size, size), mode="bilinear", antialias=True)
