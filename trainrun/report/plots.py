"""Trade-off figures: quality against time, cost or budget, one curve per recipe, the frontier marked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainrun.atomic_io import atomic_write
from trainrun.report import curves
from trainrun.report.curves import Point
from trainrun.report.runs import AUTO
from trainrun.report.sections import Report

Axis = Callable[[Point], float]


def plot_tradeoff(
    report: Report, axis: Axis, xlabel: str, path: Path, points: list[Point] | None = None
) -> Path | None:
    """Accuracy against ``axis``: one curve per recipe with seed spread (sd), the frontier of the
    swept points marked and recipe=auto's runs as stars; ``points`` (default: all) are drawn."""
    points = report.points if points is None else points
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = 100 if report.rule.percent else 1  # fractions drawn as percentages
    figure, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for label, curve in curves.by_label(points).items():
        ordered = sorted(curve, key=lambda p: p.budget)
        if label == AUTO:
            _draw_auto(ax, axis, ordered, scale)
        else:
            _draw_recipe(ax, axis, label, ordered, scale)
    _draw_frontier(ax, axis, curves.pareto([p for p in points if p.label != AUTO], axis), scale)
    ax.set_xlabel(xlabel)
    rule = report.rule
    ax.set_ylabel(f"final {rule.label} ({'%, ' if rule.percent else ''}{rule.direction})")
    ax.set_title(f"{rule.label} vs " + xlabel.split(" (")[0] + " (points named by budget)")
    ax.grid(alpha=0.3)
    ax.legend()
    figure.tight_layout()
    try:
        atomic_write(path, lambda handle: figure.savefig(handle, format="png"))
    finally:
        plt.close(figure)
    return path


def _draw_auto(ax: Any, axis: Axis, ordered: list[Point], scale: float) -> None:
    """Where recipe=auto landed: stars named by the recipe chosen."""
    qualities = [p.quality * scale for p in ordered]
    ax.scatter([axis(p) for p in ordered], qualities, marker="*", s=160, zorder=5, color="crimson", label="recipe=auto")
    for p in ordered:
        chosen = "/".join(sorted({r.auto["chosen"] for r in p.runs}))
        ax.annotate(
            f"auto: {chosen} ({p.budget_text})",
            (axis(p), p.quality * scale),
            textcoords="offset points",
            xytext=(6, 6),
            fontsize=7,
            color="crimson",
        )


def _draw_recipe(ax: Any, axis: Axis, label: str, ordered: list[Point], scale: float) -> None:
    """One recipe's points, seed spread as error bars, each named by its budget."""
    ax.errorbar(
        [axis(p) for p in ordered],
        [p.quality * scale for p in ordered],
        yerr=[p.quality_spread * scale for p in ordered],
        xerr=[p.seconds_spread for p in ordered] if axis is curves.seconds else None,
        marker="o",
        capsize=3,
        label=label,
    )
    for p in ordered:
        ax.annotate(
            p.budget_text, (axis(p), p.quality * scale), textcoords="offset points", xytext=(4, -10), fontsize=7
        )


def _draw_frontier(ax: Any, axis: Axis, frontier: list[Point], scale: float) -> None:
    ax.plot(
        [axis(p) for p in frontier],
        [p.quality * scale for p in frontier],
        linestyle="--",
        color="black",
        marker="s",
        markerfacecolor="none",
        markersize=10,
        label="Pareto frontier",
    )
