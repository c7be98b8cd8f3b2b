"""Selective backprop (Jiang et al., 2019): train on the examples with the highest loss.

Between ``start`` and ``end`` (fractions of the run), on every batch except each
``interval``-th, an extra forward pass without gradients (at ``scale_factor`` of the resolution)
scores each example by its cross-entropy. Examples are ranked, example of rank r (0 = lowest
loss) gets weight ((r + 0.5) / N)^(1/keep − 1), and int(keep · N) are drawn without replacement
in proportion to it; only those go forward and backward. Done at AFTER_DATALOADER, before
batch mixing and augmentation on the device see the batch. The scoring pass leaves
batch-norm statistics as they were.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from trainrun.algorithms.specs.selective_backprop import SelectiveBackpropConfig
from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.core.work import StepWork


def selection_weights(losses: torch.Tensor, keep: float) -> torch.Tensor:
    """Sampling weight of each example: a power of its loss percentile."""
    ranks = torch.empty_like(losses)
    ranks[losses.argsort()] = torch.arange(len(losses), dtype=losses.dtype, device=losses.device)
    return ((ranks + 0.5) / len(losses)) ** (1.0 / keep - 1.0)


def select(losses: torch.Tensor, keep: float) -> torch.Tensor:
    """Indices of the int(keep · N) examples kept, favouring high losses."""
    count = max(int(keep * len(losses)), 1)
    return torch.multinomial(selection_weights(losses.float(), keep), count, replacement=False)


class SelectiveBackprop(Algorithm):
    name = "selective_backprop"
    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(self, config: SelectiveBackpropConfig) -> None:
        self.config = config

    def match(self, event: Event, state: State) -> bool:
        config = self.config
        if event is not Event.AFTER_DATALOADER:
            return False
        active = config.start <= state.progress < config.end
        return active and (state.batch + 1) % config.interval != 0

    def step_work(self, work: StepWork, progress: float) -> StepWork:
        """Between ``start`` and ``end``, all but each ``interval``-th batch: a scoring forward of the
        whole batch at ``scale_factor`` of its side, then forward and backward of ``keep`` of it."""
        config = self.config
        if not config.start <= progress < config.end:
            return work
        selective = 1 - 1 / config.interval  # of the batches
        return dataclasses.replace(
            work,
            trained_share=work.trained_share * (1 - selective * (1 - config.keep)),
            scored_share=work.scored_share + selective * config.scale_factor**2,
        )

    @torch.no_grad()
    def apply(self, event: Event, state: State) -> None:
        model, inputs = state.raw_model, state.inputs
        if self.config.scale_factor < 1:
            inputs = F.interpolate(inputs, scale_factor=self.config.scale_factor, mode="bilinear", antialias=True)
        buffers = [buffer.clone() for buffer in model.buffers()]
        with state.precision.autocast():
            logits = model(inputs)
        torch._foreach_copy_(list(model.buffers()), buffers)
        losses = F.cross_entropy(logits.float(), state.targets, reduction="none")
        chosen = select(losses, self.config.keep)
        state.inputs, state.targets = state.inputs[chosen], state.targets[chosen]
