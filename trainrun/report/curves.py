"""Trade-off curves: a recipe's quality against its time or cost over a range of budgets.

A point is one (recipe, budget) averaged over its seeds. The Pareto frontier keeps the points
no other point beats on both axes. The time a recipe needs to reach an accuracy is read off its
own frontier by linear interpolation between measured points; it is never extrapolated beyond
them, and a target at or below the cheapest point is reported as "at most" that point's time.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trainrun.quality import Quality
from trainrun.report.runs import Run

Axis = Callable[["Point"], float | None]  # what a curve is drawn against: time, cost or budget


@dataclass(frozen=True)
class Point:
    """A recipe at one budget, over its seeds."""

    label: str
    budget: float
    runs: tuple[Run, ...]

    @property
    def seeds(self) -> int:
        return len(self.runs)

    @property
    def budget_text(self) -> str:
        """The budget as written: a schedule ratio, or a wall-clock or cost ``max_duration``."""
        return self.runs[0].budget_text

    @property
    def budgeted(self) -> bool:
        return self.runs[0].budgeted

    @property
    def epochs(self) -> float | None:
        epochs = [r.epochs for r in self.runs]
        return None if None in epochs else statistics.fmean(epochs)

    @property
    def quality(self) -> float:
        return statistics.fmean(r.quality for r in self.runs)

    @property
    def rule(self) -> Quality:
        return self.runs[0].rule

    @property
    def quality_spread(self) -> float:
        return _spread([r.quality for r in self.runs])

    @property
    def quality_range(self) -> tuple[float, float]:
        return min(r.quality for r in self.runs), max(r.quality for r in self.runs)

    @property
    def seconds(self) -> float:
        return statistics.fmean(r.train_seconds for r in self.runs)

    @property
    def seconds_spread(self) -> float:
        return _spread([r.train_seconds for r in self.runs])

    @property
    def cost(self) -> float | None:
        costs = [r.cost for r in self.runs]
        return None if None in costs else statistics.fmean(costs)

    @property
    def time_source(self) -> str:
        return "; ".join(sorted({r.time_source for r in self.runs}))


@dataclass(frozen=True)
class Reach:
    """How much time (or money) a recipe needs for an accuracy, read off its curve."""

    value: float
    at_most: bool  # the cheapest measured point already reaches it


def points(runs: Iterable[Run]) -> list[Point]:
    """Runs with an accuracy grouped by (label, budget), ordered by label then budget."""
    groups: dict[tuple[str, float], list[Run]] = {}
    for run in runs:
        if run.quality is not None and run.train_seconds is not None:
            groups.setdefault((run.label, run.budget), []).append(run)
    return [Point(label, budget, tuple(group)) for (label, budget), group in sorted(groups.items())]


def pareto(candidates: Iterable[Point], axis: Axis) -> list[Point]:
    """The points no other point beats (cheaper or equal on ``axis`` with better quality: higher
    accuracy, lower loss), cheapest first."""
    ordered = sorted((p for p in candidates if axis(p) is not None), key=lambda p: (axis(p), -p.rule.key(p.quality)))
    frontier: list[Point] = []
    for point in ordered:
        if not frontier or point.rule.better(point.quality, frontier[-1].quality):
            frontier.append(point)
    return frontier


def reach(curve: list[Point], target: float, axis: Axis) -> Reach | None:
    """The ``axis`` value at which ``curve`` (one recipe's points) first reaches ``target`` quality."""
    frontier = pareto(curve, axis)
    for index, point in enumerate(frontier):
        if point.rule.reached(point.quality, target):
            if index == 0:
                return Reach(axis(point), at_most=True)
            before = frontier[index - 1]
            fraction = (target - before.quality) / (point.quality - before.quality)
            return Reach(axis(before) + fraction * (axis(point) - axis(before)), at_most=False)
    return None


@dataclass(frozen=True)
class Speedup:
    """How many times less time (or money) a recipe needs than the baseline for one quality."""

    value: float
    bound: str  # "" as read off both curves; ">=" at least (the recipe's cheapest point reaches the
    # quality, so its time is an upper bound); "<=" at most (the baseline's cheapest point does)


def speedup(theirs: Reach | None, mine: Reach | None) -> Speedup | None:
    """The baseline's reach (``theirs``) over a recipe's (``mine``) for one target, or None where
    the ratio is not known: either never reaches the target, or both reach it at their cheapest
    point (two upper bounds)."""
    if theirs is None or mine is None or (theirs.at_most and mine.at_most):
        return None
    return Speedup(theirs.value / mine.value, ">=" if mine.at_most else "<=" if theirs.at_most else "")


def by_label(all_points: list[Point]) -> dict[str, list[Point]]:
    """Points per recipe label, in label order."""
    curves: dict[str, list[Point]] = {}
    for point in all_points:
        curves.setdefault(point.label, []).append(point)
    return curves


def seconds(point: Point) -> float:
    return point.seconds


def cost(point: Point) -> float | None:
    return point.cost


def budget(point: Point) -> float:
    """A budgeted point's budget: training seconds, or dollars."""
    return point.budget


def _spread(values: list[float]) -> float:
    """Sample standard deviation over seeds (0 for one seed)."""
    return statistics.stdev(values) if len(values) > 1 else 0.0
