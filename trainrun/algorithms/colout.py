"""ColOut: drop a random fraction of rows and columns of each training image.

At AFTER_DATALOADER (training batches only) int((1 − p_row) · H) rows and
int((1 − p_col) · W) columns are kept, in their order: 176 px → 149 px at p = 0.15. With
``batch`` the same rows and columns go for the whole batch (one cheap slice); otherwise each
sample draws its own, gathered on the device (Composer does this per sample in the dataset).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from trainrun.algorithms.specs.colout import ColOutConfig
from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.core.work import StepWork


def kept(count: int, size: int, drop: float, device: torch.device) -> torch.Tensor:
    """``count`` rows of sorted random indices, each keeping int((1 - drop) * size) of ``size``."""
    keep = int((1 - drop) * size)
    return torch.rand(count, size, device=device).argsort(dim=1)[:, :keep].sort(dim=1).values


def colout(images: torch.Tensor, p_row: float, p_col: float, batch: bool) -> torch.Tensor:
    """Images (N, C, H, W) with rows and columns dropped."""
    n, channels, height, width = images.shape
    rows = kept(1 if batch else n, height, p_row, images.device)
    cols = kept(1 if batch else n, width, p_col, images.device)
    if batch:
        return images[:, :, rows[0]][:, :, :, cols[0]]
    rows = rows[:, None, :, None].expand(n, channels, rows.shape[1], width)
    images = images.gather(2, rows)
    cols = cols[:, None, None, :].expand(n, channels, images.shape[2], cols.shape[1])
    return images.gather(3, cols)


class ColOut(Algorithm):
    name = "colout"
    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(self, config: ColOutConfig) -> None:
        self.config = config

    def step_work(self, work: StepWork, progress: float) -> StepWork:
        """The rows and columns kept, of the side the step trains at."""
        side = work.resolution
        kept_rows, kept_cols = (int((1 - drop) * side) for drop in (self.config.p_row, self.config.p_col))
        return dataclasses.replace(work, pixel_share=work.pixel_share * kept_rows * kept_cols / side**2)

    def device_work(self, state: State) -> tuple[Callable[[], object], str]:
        """Its rows and columns dropped from a batch at the run's full side, every step."""
        inputs = state.inputs
        return (lambda: colout(inputs, self.config.p_row, self.config.p_col, self.config.batch)), "1ba"

    def apply(self, event: Event, state: State) -> None:
        state.inputs = colout(state.inputs, self.config.p_row, self.config.p_col, self.config.batch)
