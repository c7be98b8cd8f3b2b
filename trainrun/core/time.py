"""Training time as a type: ``90ep``, ``100ba``, ``3000sp``, ``0.5dur``, or a budget ``30min``.

Every duration in a config (``max_duration``, ``eval_interval``, schedule times, algorithm
intervals) is a :class:`Time`. Code asks :class:`Timeline` for progress in batches instead of
counting epochs itself, so a schedule written in any unit runs exactly on every step.

``max_duration`` may also be a budget: wall-clock training time (``90s``, ``30min``, ``2h``) or
money (``50usd`` at the hardware's price). A budget's step count is not known in advance, so its
timeline is re-planned as the run goes (:meth:`Timeline.replan`): the fraction of the run done is
a piecewise-linear function of the step, continuous and rising, that reaches 1 at the step where
the budget runs out. ``dur`` times follow it, so every schedule ends with the budget.
"""

from __future__ import annotations

import bisect
import functools
import math
import re
from dataclasses import dataclass
from enum import Enum

_TIME_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*(ep|ba|sp|dur|s|min|h|usd)\s*$")
UNPLANNED_BATCHES = 2**53  # a budgeted run's end before the first step is timed: progress stays ~0
_SECONDS_PER_UNIT = {"s": 1.0, "min": 60.0, "h": 3600.0}


class TimeUnit(str, Enum):
    """Units a :class:`Time` may be written in."""

    EPOCH = "ep"
    BATCH = "ba"
    SAMPLE = "sp"
    DURATION = "dur"
    SECOND = "s"
    MINUTE = "min"
    HOUR = "h"
    DOLLAR = "usd"  # money at the hardware's price per node-hour

    @property
    def is_budget(self) -> bool:
        """Wall-clock time or money rather than an amount of training."""
        return self.value in ("s", "min", "h", "usd")


@dataclass(frozen=True)
class Time:
    """A point or span of training: integer epochs, batches or samples, or a fraction of the run."""

    value: float
    unit: TimeUnit

    @classmethod
    def parse(cls, text: str | Time) -> Time:
        """Parse ``"<number><unit>"``; raise ``ValueError`` naming the text when it is not one."""
        if isinstance(text, Time):
            return text
        return _parse(str(text))

    def __str__(self) -> str:
        return f"{self.value:g}{self.unit.value}"

    @property
    def wall_seconds(self) -> float:
        """Seconds of a wall-clock budget (``s``, ``min``, ``h``)."""
        return self.value * _SECONDS_PER_UNIT[self.unit.value]

    def scaled(self, ratio: float) -> Time:
        """This time stretched by ``ratio``; whole units are truncated, never below 1 if non-zero.

        ``dur`` fractions and budgets are not stretched: a budget is what the run may spend.
        """
        if self.unit is TimeUnit.DURATION or self.unit.is_budget:
            return self
        scaled = int(self.value * ratio)
        return Time(max(scaled, 1) if self.value > 0 else 0, self.unit)


@functools.lru_cache(maxsize=1024)
def _parse(text: str) -> Time:
    """Parse one time string (cached: the trainer converts its intervals every step)."""
    match = _TIME_PATTERN.match(text)
    if match is None:
        raise ValueError(
            f"'{text}' is not a time: write a positive number and a unit, e.g. 90ep, 100ba, 3000sp or 0.5dur "
            "(max_duration also takes a budget: 90s, 30min, 2h or 50usd)"
        )
    number, exponent, unit_text = match.groups()
    value = float(number) * (10 ** int(exponent) if exponent else 1)
    unit = TimeUnit(unit_text)
    if unit in (TimeUnit.EPOCH, TimeUnit.BATCH, TimeUnit.SAMPLE):
        if value != int(value):
            raise ValueError(f"'{text}' is not a time: {unit_text} counts whole units")
        value = int(value)
    return Time(value, unit)


def is_budget(text: str) -> bool:
    """Whether ``text`` is a wall-clock or cost budget (``30min``, ``50usd``)."""
    try:
        return Time.parse(text).unit.is_budget
    except ValueError:
        return False


def budget_size(text: str) -> float:
    """A budget's size for ordering: seconds of wall-clock time, or dollars."""
    budget = Time.parse(text)
    return budget.value if budget.unit is TimeUnit.DOLLAR else budget.wall_seconds


class Timeline:
    """Converts any :class:`Time` to batches for one run, and says how much of the run a step is.

    The timeline owns the run's scale-schedule ratio (``stretch``): ``max_batches`` already
    includes it, and :meth:`stretched_batches` stretches a schedule time written in ep, ba or sp;
    ``dur`` fractions are taken of the stretched run. The fraction of the run done after ``b``
    steps is linear between knots ``(step, fraction)``: for a run of a fixed length the two knots
    ``(0, 0)`` and ``(max_batches, 1)``, so ``x dur`` is ``round(x * max_batches)`` steps; a
    budgeted run adds a knot at every re-plan.
    """

    def __init__(self, batches_per_epoch: int, samples_per_batch: int, max_batches: int, stretch: float = 1.0) -> None:
        self.batches_per_epoch = batches_per_epoch
        self.samples_per_batch = samples_per_batch
        self.stretch = stretch
        self.knots: list[tuple[int, float]] = [(0, 0.0), (max_batches, 1.0)]
        self._steps: dict[Time | str | tuple[str, Time | str], int] = {}  # conversions for the current knots

    @classmethod
    def for_run(
        cls, max_duration: Time, batches_per_epoch: int, samples_per_batch: int, stretch: float = 1.0
    ) -> Timeline:
        """Build the timeline of a run lasting ``max_duration`` (not ``dur``, not a budget),
        scaled by ``stretch`` in its own unit (90ep x 0.36 = 32ep, as the published recipes count)."""
        if max_duration.unit is TimeUnit.DURATION:
            raise ValueError("max_duration cannot be written in 'dur'")
        if max_duration.unit.is_budget:
            raise ValueError("a budget's timeline is planned as the run goes: use Timeline.for_budget")
        partial = cls(batches_per_epoch, samples_per_batch, max_batches=0)
        steps = max(partial.to_batches(max_duration.scaled(stretch)), 1)
        return cls(batches_per_epoch, samples_per_batch, steps, stretch)

    @classmethod
    def for_budget(cls, batches_per_epoch: int, samples_per_batch: int, stretch: float = 1.0) -> Timeline:
        """A budgeted run's timeline before its first re-plan: no step count yet, fraction ~0. A
        budget is never stretched; ``stretch`` applies to schedule times only."""
        return cls(batches_per_epoch, samples_per_batch, UNPLANNED_BATCHES, stretch)

    @property
    def max_batches(self) -> int:
        """The run's last step (for a budget: as planned now)."""
        return self.knots[-1][0]

    def fraction(self, batch: int) -> float:
        """Fraction of the run done after ``batch`` steps, 0 to 1."""
        if batch >= self.max_batches:
            return 1.0
        index = bisect.bisect_right(self.knots, batch, key=lambda knot: knot[0])
        (b0, f0), (b1, f1) = self.knots[index - 1], self.knots[index]
        return f0 + (f1 - f0) * (batch - b0) / (b1 - b0)

    def replan(self, batch: int, steps_left: int) -> None:
        """The run now ends ``steps_left`` steps after ``batch``: progress stays continuous at
        ``batch`` and rises linearly from there to 1 at the new end (at once, at ``batch``, when none
        are left: the steps before keep the fractions they were trained at)."""
        kept = [knot for knot in self.knots if knot[0] < batch]
        self.knots = [*kept, (batch, self.fraction(batch)), (batch + max(steps_left, 0), 1.0)]
        self._steps.clear()

    def to_batches(self, time: Time | str) -> int:
        """Number of optimizer steps that ``time`` spans in this run (remembered until a re-plan:
        the trainer, the LR schedule and algorithms convert their times every step)."""
        steps = self._steps.get(time)
        if steps is None:
            steps = self._steps[time] = self._convert(Time.parse(time))
        return steps

    def stretched_batches(self, time: Time | str) -> int:
        """Steps a schedule time spans: ep, ba and sp stretched by the scale-schedule ratio; ``dur``
        follows the (already stretched) run. Remembered like :meth:`to_batches` (the LR schedule
        asks every step)."""
        key = ("stretched", time)
        steps = self._steps.get(key)
        if steps is None:
            parsed = Time.parse(time)
            steps = self.to_batches(parsed)
            if parsed.unit is not TimeUnit.DURATION:
                steps = int(steps * self.stretch)
            self._steps[key] = steps
        return steps

    def _convert(self, time: Time) -> int:
        if time.unit is TimeUnit.EPOCH:
            return int(time.value) * self.batches_per_epoch
        if time.unit is TimeUnit.BATCH:
            return int(time.value)
        if time.unit is TimeUnit.SAMPLE:
            return math.ceil(int(time.value) / self.samples_per_batch)
        if time.unit is TimeUnit.DURATION:
            return self._batch_at(time.value)
        raise ValueError(f"'{time}' is a budget, not an amount of training")

    def _batch_at(self, fraction: float) -> int:
        """The step at which the run is ``fraction`` done, rounded to the nearest step."""
        if fraction >= 1.0:
            return self.max_batches
        index = bisect.bisect_right(self.knots, fraction, key=lambda knot: knot[1])
        (b0, f0), (b1, f1) = self.knots[index - 1], self.knots[index]
        return int(round(b0 + (b1 - b0) * (fraction - f0) / (f1 - f0)))

    def ends_interval(self, batch: int, every: int) -> bool:
        """True when ``batch`` (steps done) closes an interval of ``every`` steps or the run."""
        return batch == self.max_batches or (every > 0 and batch % every == 0)

    def state_dict(self) -> dict[str, list[list[float]]]:
        return {"knots": [list(knot) for knot in self.knots]}

    def load_state_dict(self, state_dict: dict[str, list[list[float]]]) -> None:
        self.knots = [(int(batch), float(done)) for batch, done in state_dict["knots"]]
        self._steps.clear()
