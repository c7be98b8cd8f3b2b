"""Attention window warmup (the GPT-2 speedrun, records 13 to 21): sliding-window attention whose
window grows linearly from ``start`` to ``end`` tokens over the first ``duration`` of the run.

Early steps attend locally, which is what a model this young learns from, and on a GPU they cost
less: FlexAttention skips the blocks outside the window. The window after ``p`` of the run is
``start + (end - start) · min(p / duration, 1)`` rounded up to a multiple of ``multiple``: 128 →
1,792 with the defaults, never more than one block from the speedrun's own
``next_multiple_of_n(1728 · p, 128)``. Written in
the fraction of the run done, so a budgeted or resumed run follows it too. At INIT the GPT switches
to windowed attention; before each step (BATCH_START) and each evaluation (EVAL_START) it is given
the window for the run's progress. The window is a tensor on the device, so a compiled model does
not recompile as it grows. A finished run's window is ``end``; a checkpoint records the window its
weights last attended with, and ``trainrun sample`` attends with that one.
"""

from __future__ import annotations

import math

import torch

from trainrun.algorithms.specs.window_warmup import WindowWarmupConfig
from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.errors import ConfigError
from trainrun.models.capabilities import WindowedAttention


def window_at(progress: float, config: WindowWarmupConfig) -> int:
    """Tokens each query sees (itself included) after ``progress`` of the run."""
    grown = config.start + (config.end - config.start) * min(progress / config.duration, 1.0)
    return config.multiple * math.ceil(grown / config.multiple)


class WindowWarmup(Algorithm):
    name = "window_warmup"
    events = frozenset({Event.INIT, Event.BATCH_START, Event.EVAL_START})

    config: WindowWarmupConfig

    def __init__(self, config: WindowWarmupConfig) -> None:
        super().__init__(config)
        self.window: int | None = None  # the last window given to the model

    def apply(self, event: Event, state: State) -> None:
        model = state.raw_model
        if event is Event.INIT and not isinstance(model, WindowedAttention):
            raise ConfigError(
                f"algorithm 'window_warmup' needs trainrun's GPT (model=gpt*), not {type(model).__name__}"
            )
        self.window = window_at(state.progress, self.config)
        model.set_window(self.window)

    def state_dict(self) -> dict[str, int | None]:
        return {"window": self.window}  # read by trainrun sample; a resumed run recomputes it from its progress

    def restore_evaluated(self, model: torch.nn.Module, saved: dict[str, int | None]) -> None:
        """The window the checkpoint's weights last attended with (``end`` for a checkpoint that
        does not record it, written before trainrun did)."""
        model.set_window(saved.get("window") or window_at(1.0, self.config))
