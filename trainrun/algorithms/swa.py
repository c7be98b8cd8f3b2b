"""Stochastic weight averaging (Izmailov et al., 2018) with ``torch.optim.swa_utils``.

From ``swa_start`` to ``swa_end`` the training weights are averaged with equal weights every
``update_interval`` (at BATCH_END), in an ``AveragedModel``. At the first BATCH_END at or after
``swa_end`` the average is copied into the model; the rest of the run (3 % by default) trains
on from it so that batch-norm statistics match the averaged weights, as Composer does, and the
run's own learning-rate schedule is kept (Composer's default, no SWALR).

With EMA: SWA runs before EMA at BATCH_END (each spec's ``position``), so the step that loads the SWA
average also feeds it to EMA; both average the training weights, never each other's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel

from trainrun.algorithms.specs.swa import SWAConfig
from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State


class SWA(Algorithm):
    name = "swa"
    events = frozenset({Event.FIT_START, Event.BATCH_END})

    def __init__(self, config: SWAConfig) -> None:
        self.config = config
        self.average: AveragedModel | None = None
        self.loaded = False
        self.interval = 0

    def window(self, state: State) -> tuple[int, int]:
        """The steps averaging starts and ends at, as the timeline stands now (a budgeted run's moves)."""
        return state.timeline.to_batches(self.config.swa_start), state.timeline.to_batches(self.config.swa_end)

    def match(self, event: Event, state: State) -> bool:
        if event is not Event.BATCH_END:
            return event is Event.FIT_START
        start, end = self.window(state)
        if self.loaded or state.batch < start:
            return False
        return state.batch >= end or (state.batch - start) % self.interval == 0

    def apply(self, event: Event, state: State) -> None:
        if event is Event.FIT_START:
            self._start(state)
        elif state.batch >= self.window(state)[1]:
            with torch.no_grad():
                for target, source in zip(state.raw_model.parameters(), self.average.module.parameters()):
                    target.copy_(source)
            self.loaded = True
        else:
            self.average.update_parameters(state.raw_model)

    def _start(self, state: State) -> None:
        self.interval = max(state.timeline.to_batches(self.config.update_interval), 1)
        self.average = AveragedModel(state.raw_model)

    def state_dict(self) -> dict[str, Any]:
        if self.average is None:
            return {}
        return {"average": self.average.state_dict(), "loaded": self.loaded}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:  # called after FIT_START has built the average
            self.average.load_state_dict(state_dict["average"])
            self.loaded = state_dict["loaded"]
