"""Channels-last (NHWC; NDHWC for 3-D convolutions) memory format for the model's weights and the
input batches.

Applied at INIT, before the model is wrapped for distributed training, so DDP sees NHWC
tensors. It makes NHWC the run's memory format: the data side normalises every batch, training
and evaluation, straight into it (one copy), sparing the first convolution a layout change.
"""

import torch

from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State


class ChannelsLast(Algorithm):
    name = "channels_last"
    events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State) -> None:
        volumetric = any(parameter.dim() == 5 for parameter in state.model.parameters())  # 3-D convolutions
        memory_format = torch.channels_last_3d if volumetric else torch.channels_last
        state.model.to(memory_format=memory_format)
        state.memory_format = memory_format
