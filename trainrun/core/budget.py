"""Training to a wall-clock budget: the run ends when its training time is spent.

How many steps fit is re-estimated after every step: rank 0 divides the training time left by
the seconds per step of the last few steps, and when that moves the end by more than a small
share of the steps left (by any step near the end) the timeline is re-planned
(:meth:`~trainrun.core.time.Timeline.replan`). Every rank receives rank 0's count (a CPU
broadcast, no device synchronisation), so learning rates agree and all ranks stop at the same
step. The last step is the one during which the budget runs out, give or take half a step, and
the LR schedule and every ``dur`` time reach their end on it. Training
time is the time-to-accuracy clock: evaluation and checkpoints do not spend the budget, and a
resumed run continues from the time its checkpoint recorded.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainrun.core.state import State
from trainrun.core.time import UNPLANNED_BATCHES
from trainrun.errors import ConfigError

RATE_WINDOW = 16  # steps the seconds per step are averaged over
REPLAN_TOLERANCE = 0.005  # re-plan when the end moves by more than this share of the steps left


@dataclass
class Measurement:
    """Training seconds at the end of a step."""

    steps: int
    seconds: float


class WallClockBudget:
    """Re-plans ``state.timeline`` so that training ends when ``seconds`` of training time are spent.

    ``label`` is the budget as the user wrote it (``30min``, ``50usd``), for messages.
    """

    def __init__(self, seconds: float, label: str) -> None:
        self.seconds, self.label = seconds, label
        self.recent: deque[Measurement] = deque(maxlen=RATE_WINDOW + 1)

    def after_step(self, state: State, steps: int) -> None:
        """Called once ``steps`` optimizer steps are done, before the LR schedule advances: when
        the budget ends the run at this step, the schedule's last value is its end."""
        now = Measurement(steps, state.accounts.train_seconds())
        self.recent.append(now)
        if len(self.recent) == 1:  # the first step carries one-off costs: the rate starts after it
            if steps == 1 and _agreed(int(now.seconds > self.seconds), state):
                raise ConfigError(
                    f"bad value for 'max_duration': {self.label} ({self.seconds:.3g} s of training) is shorter than "
                    f"one training step here (the first took {now.seconds:.3g} s)"
                )
            return
        oldest = self.recent[0]
        per_step = (now.seconds - oldest.seconds) / (now.steps - oldest.steps)
        steps_left = _agreed(round(max(self.seconds - now.seconds, 0.0) / max(per_step, 1e-9)), state)
        if abs(steps + steps_left - state.timeline.max_batches) > int(steps_left * REPLAN_TOLERANCE):
            state.timeline.replan(steps, steps_left)

    def resume(self, state: State, spent: float) -> None:
        """Continue a checkpointed plan; a run that ended with time left trains on (at the end of its
        schedules) until a measured rate plans its new end."""
        if spent < self.seconds and state.timeline.max_batches <= state.batch:
            state.timeline.replan(state.batch, UNPLANNED_BATCHES - state.batch)


def _agreed(value: int, state: State) -> int:
    """Rank 0's ``value`` on every rank (a CPU tensor: no device synchronisation)."""
    if state.world_size == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.broadcast(tensor, src=0)
    return int(tensor.item())
