"""A run's quality metric and which way is better: what targets, stop_at, best values, Pareto
frontiers, reports and recipe choices compare by.

Accuracy-like metrics (top-1, masked-token accuracy) are fractions where higher is better,
shown as percentages; a loss (a causal language model's validation loss) is better lower and is
shown as a number. A task's spec declares its :class:`Quality` (:class:`trainrun.kinds.TaskSpec`);
``summary.json`` records it, so a report reads a run's direction from the run (runs written before
it was recorded were top-1-like).
Torch-free: reports and ``recipe=auto`` read it without importing torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Quality:
    """The metric time-to-quality is measured in: its name, label, direction and display."""

    metric: str
    label: str
    higher_is_better: bool = True
    percent: bool = True  # a fraction shown as a percentage; else a plain number (a loss)

    def reached(self, value: float, target: float) -> bool:
        """Whether ``value`` is at or past ``target`` in the better direction."""
        return value >= target if self.higher_is_better else value <= target

    def better(self, value: float, other: float) -> bool:
        """Whether ``value`` is strictly better than ``other``."""
        return value > other if self.higher_is_better else value < other

    def best(self, values: Iterable[float], default: float | None = None) -> float | None:
        """The best of ``values`` (``default`` when there are none)."""
        return (max if self.higher_is_better else min)(values, default=default)

    def key(self, value: float) -> float:
        """A sort key under which larger is better, whichever the direction."""
        return value if self.higher_is_better else -value

    def format(self, value: float | None, signed: bool = False) -> str:
        """``76.60%`` for a fraction, ``3.2800`` for a loss, ``-`` for nothing; ``signed``: a
        difference, ``+0.40%`` or ``-0.0200``."""
        if value is None:
            return "-"
        sign = "+" if signed else ""
        return f"{value:{sign}.2%}" if self.percent else f"{value:{sign}.4f}"

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"

    def as_summary(self) -> dict[str, Any]:
        """The entries ``summary.json`` records."""
        return {
            "quality_metric": self.metric,
            "quality_label": self.label,
            "quality_higher_is_better": self.higher_is_better,
            "quality_percent": self.percent,
        }

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> Quality:
        """The quality a run's ``summary.json`` records (top-1, higher is better, before it did)."""
        metric = summary.get("quality_metric", TOP1.metric)
        return cls(
            metric,
            summary.get("quality_label", TOP1.label if metric == TOP1.metric else metric),
            bool(summary.get("quality_higher_is_better", True)),
            bool(summary.get("quality_percent", True)),
        )


TOP1 = Quality("top1", "top-1")  # what runs, tables and choices were measured in before tasks said
