"""Channels-last (NHWC; NDHWC for 3-D convolutions) memory format for the model's weights and the
input batches.

Applied at INIT, before the model is wrapped for distributed training, so DDP sees NHWC
tensors. It makes NHWC the run's memory format: the data side normalises every batch, training
and evaluation, straight into it (one copy), sparing the first convolution a layout change.
"""

import torch
from torch import nn

from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State


class ChannelsLast(Algorithm):
    name = "channels_last"
    events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State) -> None:
        state.memory_format = memory_format_for(state.model)
        state.model.to(memory_format=state.memory_format)

    def rebuild(self, model: nn.Module) -> None:
        """The model laid out as the run's (``trainrun estimate`` times its convolutions in it)."""
        model.to(memory_format=memory_format_for(model))


def memory_format_for(model: nn.Module) -> torch.memory_format:
    """NHWC, or NDHWC where the model has 3-D convolutions."""
    volumetric = any(parameter.dim() == 5 for parameter in model.parameters())
    return torch.channels_last_3d if volumetric else torch.channels_last
