"""Training time as a type: ``90ep``, ``100ba``, ``3000sp`` or ``0.5dur``.

Every duration in a config (``max_duration``, ``eval_interval``, schedule times, algorithm
intervals) is a :class:`Time`. Code asks :class:`Timeline` for progress in batches instead of
counting epochs itself, so a schedule written in any unit runs exactly on every step.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

_TIME_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*(ep|ba|sp|dur)\s*$")


class TimeUnit(str, Enum):
    """Units a :class:`Time` may be written in."""

    EPOCH = "ep"
    BATCH = "ba"
    SAMPLE = "sp"
    DURATION = "dur"


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
        match = _TIME_PATTERN.match(str(text))
        if match is None:
            raise ValueError(f"'{text}' is not a time: write a number and a unit, e.g. 90ep, 100ba, 3000sp or 0.5dur")
        number, exponent, unit_text = match.groups()
        value = float(number) * (10 ** int(exponent) if exponent else 1)
        unit = TimeUnit(unit_text)
        if unit is not TimeUnit.DURATION:
            if value != int(value):
                raise ValueError(f"'{text}' is not a time: {unit_text} counts whole units")
            value = int(value)
        return cls(value, unit)

    def __str__(self) -> str:
        return f"{self.value:g}{self.unit.value}"

    def scaled(self, ratio: float) -> Time:
        """This time stretched by ``ratio``; whole units are truncated, never below 1 if non-zero."""
        if self.unit is TimeUnit.DURATION:
            return self
        scaled = int(self.value * ratio)
        return Time(max(scaled, 1) if self.value > 0 else 0, self.unit)


@dataclass(frozen=True)
class Timeline:
    """Converts any :class:`Time` to batches for one run.

    ``max_batches`` already includes the run's scale-schedule ratio; ``dur`` fractions are taken
    of it.
    """

    batches_per_epoch: int
    samples_per_batch: int
    max_batches: int

    @classmethod
    def for_run(cls, max_duration: Time, batches_per_epoch: int, samples_per_batch: int) -> Timeline:
        """Build the timeline of a run lasting ``max_duration`` (not ``dur``)."""
        if max_duration.unit is TimeUnit.DURATION:
            raise ValueError("max_duration cannot be written in 'dur'")
        partial = cls(batches_per_epoch, samples_per_batch, max_batches=0)
        return cls(batches_per_epoch, samples_per_batch, max(partial.to_batches(max_duration), 1))

    def to_batches(self, time: Time | str) -> int:
        """Number of optimizer steps that ``time`` spans in this run."""
        time = Time.parse(time)
        if time.unit is TimeUnit.EPOCH:
            return int(time.value) * self.batches_per_epoch
        if time.unit is TimeUnit.BATCH:
            return int(time.value)
        if time.unit is TimeUnit.SAMPLE:
            return math.ceil(int(time.value) / self.samples_per_batch)
        return int(round(time.value * self.max_batches))

    def ends_interval(self, batch: int, every: int) -> bool:
        """True when ``batch`` (steps done) closes an interval of ``every`` steps or the run."""
        return batch == self.max_batches or (every > 0 and batch % every == 0)
