"""Exponential moving average of the weights *and* buffers, evaluated in place of the weights.

Every ``update_interval`` steps (at BATCH_END): ema = s·ema + (1 − s)·w with
s = 2^(−update_interval / half_life). The average starts from the weights at FIT_START, is
swapped into the model for evaluation (EVAL_START) and swapped out again (EVAL_END), and is
saved in checkpoints. What was evaluated is what a user takes away: a finished run's export
(``hf_model``) and ``trainrun sample`` hold the average. Averaging is
``torch.optim.swa_utils.AveragedModel``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from trainrun.algorithms.specs.ema import EMAConfig
from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State


def smoothing(update_interval: int, half_life: int) -> float:
    """Per-update decay so that a weight's influence halves every ``half_life`` steps."""
    return 2.0 ** (-update_interval / half_life)


def _tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t.detach() for t in (*model.parameters(), *model.buffers())]


class EMA(Algorithm):
    name = "ema"
    events = frozenset({Event.FIT_START, Event.BATCH_END, Event.EVAL_START, Event.EVAL_END})

    def __init__(self, config: EMAConfig) -> None:
        super().__init__(config)
        self.average: AveragedModel | None = None
        self.interval = 1
        self._stash: list[torch.Tensor] = []

    def match(self, event: Event, state: State) -> bool:
        if event is Event.BATCH_END:
            return state.batch % self.interval == 0
        return event in self.events

    def apply(self, event: Event, state: State) -> None:
        if event is Event.FIT_START:
            self._start(state)
        elif event is Event.BATCH_END:
            self.average.update_parameters(state.raw_model)
        elif event is Event.EVAL_START:
            self._stash = [t.clone() for t in _tensors(state.raw_model)]
            torch._foreach_copy_(_tensors(state.raw_model), _tensors(self.average.module))
        else:
            torch._foreach_copy_(_tensors(state.raw_model), self._stash)
            self._stash = []

    def _start(self, state: State) -> None:
        timeline = state.timeline
        self.interval = max(timeline.to_batches(self.config.update_interval), 1)
        decay = smoothing(self.interval, max(timeline.to_batches(self.config.half_life), 1))
        self.average = AveragedModel(state.raw_model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
        self.average.update_parameters(state.raw_model)  # start from the current weights

    def device_work(self, state: State) -> tuple[Callable[[], object], str]:
        """An update of the average after its first (which copies), every ``update_interval``. Its count
        of updates is a real tensor: the update branches on its value, which a fake one cannot give."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with warnings.catch_warnings():  # its copy of fake weights reads their (absent) data pointers
            warnings.simplefilter("ignore", UserWarning)
            # any decay: an update's operations are the same
            average = AveragedModel(state.raw_model, multi_avg_fn=get_ema_multi_avg_fn(0.5), use_buffers=True)
        with unset_fake_temporarily():
            average.n_averaged = torch.tensor(1, dtype=torch.long)

        def update() -> None:
            with unset_fake_temporarily():  # the weights stay fake tensors, the count real
                average.update_parameters(state.raw_model)

        return update, self.config.update_interval

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average.state_dict()} if self.average is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "average" in state_dict:  # called after FIT_START has built the average
            self.average.load_state_dict(state_dict["average"])

    def restore_evaluated(self, model: torch.nn.Module, saved: dict[str, Any]) -> None:
        """The saved average in place of the weights (AveragedModel keeps the model as ``module``)."""
        if "average" in saved:
            average = saved["average"].items()
            model.load_state_dict({key.removeprefix("module."): v for key, v in average if key.startswith("module.")})
