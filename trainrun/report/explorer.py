"""The Explorer page's data: runs and the published points as series of a recipe on one task, model,
data set, machine and set of methods, with their seed means and Pareto frontiers computed here by
the report's own code (:mod:`trainrun.report.curves`).

The data is columnar (one array a field, strings that repeat stored once and referred to by
index), so a page of thousands of runs stays small and is read in one ``JSON.parse``.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from trainrun.quality import TOP1, Quality
from trainrun.report import curves
from trainrun.report.curves import Point
from trainrun.report.runs import Pricing, Run, pricing_from_flags

HERE = Path(__file__).parent
PUBLISHED = HERE / "published"
AXES = {"time": curves.seconds, "cost": curves.cost}
SOURCE = "published_source"  # a published point's summary: where it was published


@dataclass(frozen=True)
class Series:
    """What a filter can tell runs apart by: runs of one series are one curve."""

    label: str
    task: str
    model: str
    data: str
    hardware: str
    methods: tuple[str, ...]
    published: bool = False  # points trainrun ships (trainrun/report/published/), not the user's runs


def series_of(run: Run) -> Series:
    """The series ``run`` belongs to, from its config."""
    config = run.config
    methods = methods_of(config.get("algorithms") or {})
    return Series(
        run.label,
        _name(config.get("task"), "image_classification"),
        _name(config.get("model"), "unknown"),
        _name(config.get("data"), "unknown"),
        run.pricing.hardware,
        methods,
    )


def methods_of(algorithms: Mapping[str, Any]) -> tuple[str, ...]:
    """The methods a config's ``algorithms`` turns on (a method set to null is off), sorted."""
    return tuple(sorted(name for name, settings in algorithms.items() if settings is not None))


def _name(group: Any, default: str) -> str:
    return str(group.get("name", default)) if isinstance(group, dict) else default


def published_runs() -> tuple[list[tuple[Run, Series]], list[str]]:
    """Every published point trainrun ships that has a time, as a one-seed run of its series, and a
    note for each point left out (no time published)."""
    found, notes = [], []
    for table in sorted(PUBLISHED.glob("*.csv")):
        with open(table, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if not row.get("train_seconds_mean"):
                    notes.append(f"published {row['recipe']} at {row['budget']}: no time published, not drawn")
                    continue
                found.append(_published_run(table, row))
    return found, notes


def _published_run(table: Path, row: dict[str, str]) -> tuple[Run, Series]:
    pricing = _pricing(row["hardware"])
    run = Run(
        path=table,
        label=row["recipe"],
        budget=float(row["budget"]),
        seed=0,
        status="completed",
        quality=float(row[f"{TOP1.metric}_mean"]),
        train_seconds=float(row["train_seconds_mean"]),
        time_source="published",
        nodes=1,
        pricing=pricing,
        quality_targets=(),
        summary={**TOP1.as_summary(), SOURCE: row["source"]},
        budget_text=row["budget"],
        epochs=float(row["epochs_mean"]),
    )
    methods = recipe_methods(row["recipe"])
    return run, Series(row["recipe"], row["task"], row["model"], row["data"], pricing.hardware, methods, True)


@cache
def _pricing(hardware: str) -> Pricing:
    """A conf/hardware option's price, as ``trainrun report --hardware`` takes it (composed once)."""
    return pricing_from_flags(hardware, None)


@cache
def recipe_methods(recipe: str) -> tuple[str, ...]:
    """The methods a recipe of ``conf/recipe/`` turns on, as Hydra composes it."""
    from trainrun.config import compose

    return methods_of(compose([f"recipe={recipe}"]).algorithms)


class Columns:
    """Named columns of equal length, filled a row at a time."""

    def __init__(self, *names: str) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in names}

    def append(self, **values: Any) -> None:
        for name, column in self.columns.items():
            column.append(values[name])


class Strings:
    """Each distinct string once; a column holds its index."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self.index: dict[str, int] = {}

    def code(self, value: str) -> int:
        if value not in self.index:
            self.index[value] = len(self.values)
            self.values.append(value)
        return self.index[value]


def page_data(runs: list[tuple[Run, Series]], baseline: str | None, notes: list[str]) -> dict[str, Any]:
    """Everything the page draws: series, their runs (completed, with a quality and a time), seed
    means and frontiers, the qualities' rules, the baseline, each task's targets (its runs'
    ``quality_targets``) and ``notes`` on what was left out."""
    strings = Strings()
    by_series: dict[Series, list[Run]] = {}
    for run, series in runs:
        by_series.setdefault(series, []).append(run)
    ordered = sorted(by_series, key=lambda s: (s.published, s.label, s.task, s.model, s.data, s.hardware, s.methods))
    rules: list[Quality] = []
    series_rows = Columns("label", "task", "model", "data", "hardware", "methods", "published", "rule")
    run_rows = Columns("series", "folder", "budget", "seed", "quality", "seconds", "cost", "bottleneck", "command")
    point_rows = Columns("series", "budget", "seeds", "quality", "quality_sd", "seconds", "seconds_sd", "cost")
    frontiers: dict[str, list[list[int]]] = {axis: [] for axis in AXES}
    targets: dict[str, set[float]] = {}
    for number, series in enumerate(ordered):
        members = by_series[series]
        rule = members[0].rule
        rules += [] if rule in rules else [rule]
        series_rows.append(
            label=series.label,
            task=series.task,
            model=series.model,
            data=series.data,
            hardware=series.hardware,
            methods=list(series.methods),
            published=series.published,
            rule=rules.index(rule),
        )
        for run in members:
            run_rows.append(series=number, **_run_fields(run, series, strings))
            targets.setdefault(series.task, set()).update(run.quality_targets)
        curve = curves.points(members)
        first = len(point_rows.columns["series"])
        for point in curve:
            point_rows.append(series=number, **_point_fields(point, strings))
        index = {id(point): first + offset for offset, point in enumerate(curve)}
        for axis, measure in AXES.items():
            frontiers[axis].append([index[id(point)] for point in curves.pareto(curve, measure)])
    return {
        "strings": strings.values,
        "rules": [_rule_fields(rule) for rule in rules],
        "series": series_rows.columns,
        "runs": run_rows.columns,
        "points": point_rows.columns,
        "frontiers": frontiers,
        "baseline": baseline,
        "targets": {task: sorted(values) for task, values in targets.items()},
        "notes": notes,
    }


def page(data: dict[str, Any]) -> str:
    """The self-contained page: the template with plotly.js (from the plotly package), the data and
    the Explorer's script inlined; nothing is fetched when it is viewed."""
    from plotly.offline import get_plotlyjs

    parts = {
        "PLOTLY": get_plotlyjs(),
        # inside <script>: no "</script>" or "<!--" can end it early
        "DATA": json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c"),
        "EXPLORER": (HERE / "explorer.js").read_text(encoding="utf-8"),
    }
    template = (HERE / "explorer.html").read_text(encoding="utf-8")
    return re.sub(r"/\*(PLOTLY|DATA|EXPLORER)\*/", lambda match: parts[match.group(1)], template)


def _run_fields(run: Run, series: Series, strings: Strings) -> dict[str, Any]:
    bottleneck = run.summary.get("bottleneck") or {}
    where = f"{bottleneck['bottleneck_name']} {bottleneck['share']:.0%}" if "share" in bottleneck else "-"
    command = run.summary.get(SOURCE) or (run.summary.get("provenance") or {}).get("command") or "-"
    return {
        "folder": strings.code(f"published: {run.path.name}" if series.published else str(run.path)),
        "budget": strings.code(run.budget_text),
        "seed": run.seed,
        "quality": run.quality,
        "seconds": run.train_seconds,
        "cost": run.cost,
        "bottleneck": strings.code(where),
        "command": strings.code(command),
    }


def _point_fields(point: Point, strings: Strings) -> dict[str, Any]:
    return {
        "budget": strings.code(point.budget_text),
        "seeds": point.seeds,
        "quality": point.quality,
        "quality_sd": point.quality_spread,
        "seconds": point.seconds,
        "seconds_sd": point.seconds_spread,
        "cost": point.cost,
    }


def _rule_fields(rule: Quality) -> dict[str, Any]:
    return asdict(rule) | {"direction": rule.direction}
