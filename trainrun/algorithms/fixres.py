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

import torch.nn.functional as F

from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.schema import FixResConfig


class FixRes(Algorithm):
    name = "fixres"
    events = frozenset({Event.INIT, Event.EPOCH_START, Event.AFTER_DATALOADER})
    order = 25  # sets the full training resolution before progressive resizing reads it

    def __init__(self, train_resolution: int) -> None:
        self.train_resolution = train_resolution
        self.decoding = False

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.INIT, Event.EPOCH_START) or (event is Event.AFTER_DATALOADER and not self.decoding)

    def apply(self, event: Event, state: State) -> None:
        if event is Event.INIT:
            state.train_resolution = self.train_resolution
        elif event is Event.EPOCH_START:
            self.decoding = state.data is not None and state.data.set_train_resolution(self.train_resolution)
        elif state.inputs.shape[-1] > self.train_resolution:
            size = (self.train_resolution, self.train_resolution)
            state.inputs = F.interpolate(state.inputs, size=size, mode="bilinear", antialias=True)


def build(config: FixResConfig) -> FixRes:
    return FixRes(config.train_resolution)
