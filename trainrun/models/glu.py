"""A gated feed-forward block, ``act(gated(x)) * non_gated(x)``: what the gated_linear_units method
puts in place of a transformer layer's intermediate (Shazeer, 2020; Mosaic BERT's GeGLU)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class GatedIntermediate(nn.Module):
    """``act(gated(x)) * non_gated(x)``: the feed-forward block's first half as a GLU."""

    def __init__(
        self,
        hidden: int,
        width: int,
        activation: Callable[[torch.Tensor], torch.Tensor],
        gated_bias: bool = False,
        non_gated_bias: bool = False,
    ) -> None:
        super().__init__()
        self.gated = nn.Linear(hidden, width, bias=gated_bias)
        self.non_gated = nn.Linear(hidden, width, bias=non_gated_bias)
        self.activation = activation

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.gated(hidden_states)) * self.non_gated(hidden_states)
