"""Sequence-length warmup (Li et al., 2021): train on the first tokens of each sequence only, a
length that grows linearly to the full sequence over the first ``duration`` of the run.

Composer's schedule, written in the fraction of the run done (so a budgeted run follows it too):
with ``n = (max - min) // step_size`` increments, the length after ``p`` of the run is
``min + step_size * floor(p / duration * n)``, held at ``max`` from ``duration`` on. ``max`` is
capped at the batch's own length, so the ramp spans ``duration`` whatever the configured maximum.
At AFTER_DATALOADER the task cuts the batch's sequences to that length (Composer's ``truncate``):
early steps cost a fraction of a full one, and the positions cut off are not trained on in that
step. Serves every sequence task (masked and causal language models).
"""

from __future__ import annotations

import dataclasses
import math

from trainrun.algorithms.specs.seq_length_warmup import SeqLengthWarmupConfig
from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.core.work import StepWork


def length_at(progress: float, full: int, config: SeqLengthWarmupConfig) -> int:
    """Tokens per sequence after ``progress`` of the run, for sequences of ``full`` tokens."""
    longest = min(config.max_seq_length, full)
    shortest = min(config.min_seq_length, longest)
    if progress >= config.duration:
        return longest
    increments = (longest - shortest) // config.step_size
    grown = shortest + config.step_size * math.floor(progress / config.duration * increments)
    return min(max(grown, shortest), longest)


class SeqLengthWarmup(Algorithm):
    name = "seq_length_warmup"
    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(self, config: SeqLengthWarmupConfig) -> None:
        self.config = config

    def step_work(self, work: StepWork, progress: float) -> StepWork:
        return dataclasses.replace(work, sequence_length=length_at(progress, work.sequence_length, self.config))

    def apply(self, event: Event, state: State) -> None:
        full = state.task.sequence_length(state.inputs)
        length = length_at(state.progress, full, self.config)
        if length < full:
            state.inputs, state.targets = state.task.truncate(state.inputs, state.targets, length)
