"""The report's tables, each a :class:`Section` built from the runs and their (recipe, budget) points."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from trainrun.core.bottleneck import bound_text
from trainrun.quality import Quality
from trainrun.report import curves
from trainrun.report.curves import Point
from trainrun.report.runs import AUTO, EXTRAPOLATED, Run


@dataclass
class Section:
    """A titled table, rendered both to the console and to markdown."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass
class Report:
    runs: list[Run]
    points: list[Point]
    baseline: str | None
    targets: list[float]
    notes: list[str]

    @property
    def rule(self) -> Quality:
        """The runs' quality metric (one for all: the report command refuses a mix)."""
        return self.runs[0].rule

    @property
    def swept_points(self) -> list[Point]:
        """The points of recipes as trained; recipe=auto's runs are judged against them."""
        return [p for p in self.points if p.label != AUTO]

    @cached_property
    def on_time_frontier(self) -> set[Point]:
        return set(curves.pareto(self.swept_points, curves.seconds))

    @cached_property
    def on_cost_frontier(self) -> set[Point]:
        return set(curves.pareto(self.swept_points, curves.cost))


def build_sections(report: Report) -> list[Section]:
    """Every table of the report, in reading order."""
    sections = [_points_section(report), _reach_section(report)]
    if report.baseline is not None:
        sections.append(_speedup_section(report))
        if report.targets:
            sections.append(_target_speedup_section(report))
    if any(run.auto for run in report.runs):
        sections.append(_auto_section(report))
    sections += [_bottleneck_section(report), _runs_section(report)]
    return sections


def _points_section(report: Report) -> Section:
    on_time, on_cost, shown = report.on_time_frontier, report.on_cost_frontier, report.rule.format
    rows = []
    for p in report.points:
        low, high = p.quality_range
        frontier = "/".join(axis for axis, members in (("time", on_time), ("cost", on_cost)) if p in members)
        rows.append(
            [
                p.label,
                p.budget_text,
                str(p.seeds),
                f"{shown(p.quality)} ± {shown(p.quality_spread)}"
                + (f" ({shown(low)}-{shown(high)})" if p.seeds > 1 else ""),
                f"{p.seconds:.1f} ± {p.seconds_spread:.1f}",
                _dollars(p.cost),
                p.time_source,
                frontier or "-",
            ]
        )
    return Section(
        "trade-off points",
        [
            "recipe",
            "budget",
            "seeds",
            f"{report.rule.label} (mean ± sd, range; {report.rule.direction})",
            "train s (mean ± sd)",
            "cost",
            "time",
            "Pareto",
        ],
        rows,
        "budget = scale_schedule_ratio, or max_duration for runs trained to a time or cost budget; "
        "train time excludes evaluation and checkpoints; Pareto frontiers leave out recipe=auto's runs",
    )


def _reach_section(report: Report) -> Section:
    rows = []
    for label, curve in curves.by_label(report.points).items():
        row = [label]
        for target in report.targets:
            time_ = curves.reach(curve, target, curves.seconds)
            money = curves.reach(curve, target, curves.cost)
            row.append("not reached" if time_ is None else f"{_reach_text(time_, 's')} / {_reach_money(money)}")
        rows.append(row)
    return Section(
        "time / cost to accuracy" if report.rule.percent else f"time / cost to {report.rule.label}",
        ["recipe", *(f"{report.rule.label} {report.rule.format(t)}" for t in report.targets)],
        rows,
        "read off each recipe's frontier, interpolating between measured budgets; '<=' = its cheapest point",
    )


def _speedup_section(report: Report) -> Section:
    grouped = curves.by_label(report.points)
    reference = grouped[report.baseline]
    rows = []
    for label, curve in grouped.items():
        if label == report.baseline:
            continue
        for base in reference:
            mine = curves.reach(curve, base.quality, curves.seconds)
            theirs = curves.reach(reference, base.quality, curves.seconds)
            row = [label, base.budget_text, report.rule.format(base.quality), f"{theirs.value:.1f}"]
            if mine is None:
                rows.append([*row, "not reached", "-"])
            else:
                speedup = f"{'>=' if mine.at_most else ''}{theirs.value / mine.value:.2f}x"
                rows.append([*row, f"{mine.value:.1f}", speedup])
    return Section(
        f"speed-up over '{report.baseline}' at equal accuracy",
        ["recipe", "baseline budget", f"baseline {report.rule.label}", "baseline s", "recipe s", "speed-up"],
        rows,
        "time each recipe needs for the accuracy the baseline reached at each of its budgets",
    )


def _target_speedup_section(report: Report) -> Section:
    grouped = curves.by_label(report.points)
    reference = grouped[report.baseline]
    rows = []
    for label, curve in grouped.items():
        if label != report.baseline:
            cells = [
                " / ".join(speedup_text(reference, curve, target, axis) for axis in (curves.seconds, curves.cost))
                for target in report.targets
            ]
            rows.append([label, *cells])
    return Section(
        f"speed-up over '{report.baseline}' at each target (time / cost)",
        ["recipe", *(f"{report.rule.label} {report.rule.format(t)}" for t in report.targets)],
        rows,
        "the baseline's time (cost) to the target over the recipe's, both read off their frontiers; '>=': the "
        "recipe's cheapest point already reaches it, '<=': the baseline's does; '-': not reached, or both at "
        "their cheapest point",
    )


def speedup_text(baseline: list[Point], curve: list[Point], target: float, axis: curves.Axis) -> str:
    """The speed-up of ``curve`` over ``baseline`` at ``target`` on ``axis``, as the report and the
    Explorer show it: ``2.10x``, ``>=1.50x``, ``<=0.80x`` or ``-``."""
    found = curves.speedup(curves.reach(baseline, target, axis), curves.reach(curve, target, axis))
    return "-" if found is None else f"{found.bound}{found.value:.2f}x"


def best_within(points: list[Point], seconds: float) -> Point | None:
    """The best point (most accurate; lowest loss) that trained in at most ``seconds`` (the
    frontier at that time)."""
    affordable = [p for p in points if p.seconds <= seconds]
    return max(affordable, key=lambda p: p.rule.key(p.quality), default=None)


def _auto_section(report: Report) -> Section:
    rows = []
    for run in report.runs:
        if not run.auto or run.quality is None or run.train_seconds is None:
            continue
        best = best_within(report.swept_points, run.auto["budget_seconds"])
        shown = run.rule.format
        row = [run.budget_text, str(run.seed), run.auto["chosen"], shown(run.auto["predicted_quality"])]
        row += [shown(run.quality), f"{run.train_seconds:.1f}"]
        if best is None:
            rows.append([*row, "no swept point within the budget", "-"])
            continue
        spread = max(best.quality_spread, 0.0)
        rule = run.rule
        within = rule.reached(run.quality, best.quality - spread if rule.higher_is_better else best.quality + spread)
        verdict = "yes" if within else f"no ({rule.format(run.quality - best.quality, signed=True)})"
        best_text = f"{best.label} {best.budget_text}: {shown(best.quality)} ± {shown(spread)} in {best.seconds:.1f} s"
        rows.append([*row, best_text, verdict])
    return Section(
        "recipe=auto against the swept frontier",
        ["budget", "seed", "chosen", "predicted", report.rule.label, "train s", "best swept point within budget"]
        + ["within its seed spread"],
        rows,
        "the best swept point is the most accurate one whose training time fits the budget",
    )


def _bottleneck_section(report: Report) -> Section:
    rows = []
    for run in report.runs:
        b = run.summary.get("bottleneck")
        if not b:
            continue
        share = {key: b[f"{key}_seconds"] / b["train_seconds"] for key in ("compute", "input", "host")}
        rows.append(
            [
                run.label,
                run.budget_text,
                str(run.seed),
                f"{share['compute']:.0%}",
                f"{share['input']:.0%}",
                f"{share['host']:.0%}",
                b["bottleneck_name"],
                bound_text(b["speedup_if_rest_free"]),
                bound_text(b["speedup_if_bottleneck_free"]),
                _steady_text(run.summary.get("bottleneck_after_first_epoch")),
                b["clock"],
            ]
        )
    return Section(
        "where training time goes",
        ["recipe", "budget", "seed", "compute", "data", "host", "bottleneck", "rest free", "bottleneck free"]
        + ["after epoch 1", "clock"],
        rows,
        "Amdahl bounds: the most training could speed up if everything but the bottleneck (rest free), "
        "or the bottleneck itself, took no time; 'after epoch 1' leaves out one-off compilation and warm-up",
    )


def _runs_section(report: Report) -> Section:
    rows = []
    for run in report.runs:
        time_text = "-" if run.train_seconds is None else f"{run.train_seconds:.1f}"
        if run.time_source == EXTRAPOLATED:
            extrapolated = run.summary["extrapolated"]
            time_text += f" (extrapolated from {extrapolated['from_batches']}/{extrapolated['to_batches']} steps"
            time_text += "; step cost varies along the schedule)" if extrapolated.get("caveat") else ")"
        quality = run.rule.format(run.quality)
        row = [run.label, run.budget_text, str(run.seed), run.status, quality, time_text, _dollars(run.cost)]
        rows.append([*row, run.pricing.hardware, str(run.path)])
    return Section(
        "runs",
        [
            "recipe",
            "budget",
            "seed",
            "status",
            f"final {report.rule.label}",
            "train s",
            "cost",
            "hardware",
            "directory",
        ],
        rows,
        "only completed runs make points; profiled runs give extrapolated times only",
    )


def _dollars(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:.3g}" if value < 1 else f"${value:,.2f}"


def _reach_text(reached: curves.Reach, unit: str) -> str:
    return f"{'<=' if reached.at_most else ''}{reached.value:.1f} {unit}"


def _reach_money(reached: curves.Reach | None) -> str:
    return "-" if reached is None else ("<=" if reached.at_most else "") + _dollars(reached.value)


def _steady_text(steady: dict | None) -> str:
    """The bottleneck once the first epoch's one-off work (compilation, cache warm-up) is over."""
    return "-" if not steady else f"{steady['bottleneck_name']} {steady['share']:.0%}"
