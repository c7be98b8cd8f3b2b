"""Channels-last (NHWC) memory format for the model's weights and the input batches.

Applied at INIT, before the model is wrapped for distributed training, so later surgery and
DDP see NHWC tensors. Inputs are converted too, sparing the first convolution a layout change.
"""

import torch

from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.schema import ChannelsLastConfig


class ChannelsLast(Algorithm):
    name = "channels_last"
    events = frozenset({Event.INIT, Event.AFTER_DATALOADER})
    order = 90  # after every model surgery

    def apply(self, event: Event, state: State) -> None:
        if event is Event.INIT:
            state.model.to(memory_format=torch.channels_last)
        else:
            state.inputs = state.inputs.contiguous(memory_format=torch.channels_last)


def build(config: ChannelsLastConfig) -> ChannelsLast:
    return ChannelsLast()
