"""``trainrun report DIR...``: tables, a CSV and trade-off plots from finished runs and sweeps.

The same tables are printed with rich and written to ``report.md``; ``report.csv`` has one row
per (recipe, budget) point; ``tradeoff_time.png`` and, when runs are priced,
``tradeoff_cost.png`` draw one curve per recipe with the Pareto frontier marked.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from rich.console import Console
from rich.table import Table

from trainrun.errors import ConfigError
from trainrun.files import atomic_write, atomic_write_text
from trainrun.report import curves
from trainrun.report.bottleneck import bound_text
from trainrun.report.curves import Point
from trainrun.report.runs import AUTO, EXTRAPOLATED, Pricing, Run, find_runs, load_run


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
    def quality_metric(self) -> str:
        return self.runs[0].quality_metric

    @property
    def quality_label(self) -> str:
        return self.runs[0].quality_label

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


def report_command(argv: list[str]) -> int:
    """Entry point of ``trainrun report``."""
    args = _parser().parse_args(argv)
    pricing = _pricing(args.hardware, args.price_per_hour)
    runs, notes = [], []
    for path in find_runs(args.dirs):
        run, note = load_run(path, args.first_epoch_as_second, pricing)
        runs.append(run)
        notes += [note] if note else []
    metrics = sorted({run.quality_metric for run in runs})
    if len(metrics) > 1:
        raise ConfigError(f"the runs measure different quality metrics ({', '.join(metrics)}): report each task apart")
    all_points = curves.points(r for r in runs if r.status == "completed")
    recipes = sorted({p.label for p in all_points})
    baseline = args.baseline if args.baseline is not None else ("baseline" if "baseline" in recipes else None)
    if baseline is not None and baseline not in recipes:
        raise ConfigError(f"bad value for '--baseline': '{baseline}' (recipes: {', '.join(recipes) or 'none'})")
    targets = args.targets or sorted({t for r in runs for t in r.accuracy_targets})
    report = Report(runs, all_points, baseline, targets, notes)
    sections = build_sections(report)
    out = args.out or (args.dirs[0] if len(args.dirs) == 1 else Path("report"))
    console = Console(width=None if sys.stdout.isatty() else 200)
    for section in sections:
        console.print(_rich_table(section))
    for note in notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    written = write_report(report, sections, out)
    console.print(f"wrote {', '.join(str(path) for path in written)}", highlight=False)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainrun report",
        description="Trade-off curves, time- and cost-to-accuracy and bottlenecks of finished runs and sweeps.",
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="run, sweep or multirun directories")
    parser.add_argument("--baseline", help="the label the speed-ups are measured against (default: 'baseline')")
    parser.add_argument(
        "--targets", type=_fractions, help="accuracies to time, e.g. 0.9,0.95 (default: the runs' accuracy_targets)"
    )
    parser.add_argument("--hardware", help="price every run as this conf/hardware option instead of its own")
    parser.add_argument("--price-per-hour", type=float, help="price every run at this many dollars per node-hour")
    parser.add_argument(
        "--first-epoch-as-second",
        action="store_true",
        help="time the first epoch as the second, discounting one-off warm-up (as published baselines did)",
    )
    parser.add_argument("--out", type=Path, help="where to write (default: the one DIR given, else ./report)")
    return parser


def _fractions(text: str) -> list[float]:
    try:
        values = [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of accuracies") from None
    if not values or not all(0 < value <= 1 for value in values):
        raise argparse.ArgumentTypeError(f"'{text}': accuracies are fractions in (0, 1]")
    return sorted(values)


def _pricing(hardware: str | None, price: float | None) -> Pricing | None:
    if price is not None:
        if price < 0:
            raise ConfigError(f"bad value for '--price-per-hour': {price} (must be >= 0)")
        return Pricing(hardware or "custom", price)
    if hardware is None:
        return None
    from trainrun.config import compose, group_options
    from trainrun.schema import validate

    options = group_options("hardware")
    if hardware not in options:
        raise ConfigError(f"unknown option '{hardware}' for 'hardware' (choose from: {', '.join(options)})")
    chosen = validate(compose([f"hardware={hardware}"])).hardware
    return Pricing(chosen.name, chosen.price_per_hour)


# ----------------------------------------------------------------------------------------------
def build_sections(report: Report) -> list[Section]:
    """Every table of the report, in reading order."""
    sections = [_points_section(report), _reach_section(report)]
    if report.baseline is not None:
        sections.append(_speedup_section(report))
    if any(run.auto for run in report.runs):
        sections.append(_auto_section(report))
    sections += [_bottleneck_section(report), _runs_section(report)]
    return sections


def _points_section(report: Report) -> Section:
    on_time, on_cost = report.on_time_frontier, report.on_cost_frontier
    rows = []
    for p in report.points:
        low, high = p.quality_range
        frontier = "/".join(axis for axis, members in (("time", on_time), ("cost", on_cost)) if p in members)
        rows.append(
            [
                p.label,
                p.budget_text,
                str(p.seeds),
                f"{p.quality:.2%} ± {p.quality_spread:.2%}" + (f" ({low:.2%}-{high:.2%})" if p.seeds > 1 else ""),
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
            f"{report.quality_label} (mean ± sd, range)",
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
        "time / cost to accuracy",
        ["recipe", *(f"{report.quality_label} {t:.2%}" for t in report.targets)],
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
            row = [label, base.budget_text, f"{base.quality:.2%}", f"{theirs.value:.1f}"]
            if mine is None:
                rows.append([*row, "not reached", "-"])
            else:
                speedup = f"{'>=' if mine.at_most else ''}{theirs.value / mine.value:.2f}x"
                rows.append([*row, f"{mine.value:.1f}", speedup])
    return Section(
        f"speed-up over '{report.baseline}' at equal accuracy",
        ["recipe", "baseline budget", f"baseline {report.quality_label}", "baseline s", "recipe s", "speed-up"],
        rows,
        "time each recipe needs for the accuracy the baseline reached at each of its budgets",
    )


def best_within(points: list[Point], seconds: float) -> Point | None:
    """The most accurate point that trained in at most ``seconds`` (the frontier at that time)."""
    affordable = [p for p in points if p.seconds <= seconds]
    return max(affordable, key=lambda p: p.quality, default=None)


def _auto_section(report: Report) -> Section:
    rows = []
    for run in report.runs:
        if not run.auto or run.quality is None or run.train_seconds is None:
            continue
        best = best_within(report.swept_points, run.auto["budget_seconds"])
        row = [run.budget_text, str(run.seed), run.auto["chosen"], f"{run.auto['predicted_quality']:.2%}"]
        row += [f"{run.quality:.2%}", f"{run.train_seconds:.1f}"]
        if best is None:
            rows.append([*row, "no swept point within the budget", "-"])
            continue
        spread = max(best.quality_spread, 0.0)
        verdict = "yes" if run.quality >= best.quality - spread else f"no ({run.quality - best.quality:+.2%})"
        best_text = f"{best.label} {best.budget_text}: {best.quality:.2%} ± {spread:.2%} in {best.seconds:.1f} s"
        rows.append([*row, best_text, verdict])
    return Section(
        "recipe=auto against the swept frontier",
        ["budget", "seed", "chosen", "predicted", report.quality_label, "train s", "best swept point within budget"]
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
        quality = "-" if run.quality is None else f"{run.quality:.2%}"
        row = [run.label, run.budget_text, str(run.seed), run.status, quality, time_text, _dollars(run.cost)]
        rows.append([*row, run.pricing.hardware, str(run.path)])
    return Section(
        "runs",
        [
            "recipe",
            "budget",
            "seed",
            "status",
            f"final {report.quality_label}",
            "train s",
            "cost",
            "hardware",
            "directory",
        ],
        rows,
        "only completed runs make points; profiled runs give extrapolated times only",
    )


# ----------------------------------------------------------------------------------------------
def write_report(report: Report, sections: list[Section], out: Path) -> list[Path]:
    """report.md, report.csv and the trade-off plots, each written atomically."""
    out.mkdir(parents=True, exist_ok=True)
    figures = [_plot(report, curves.seconds, "training time (s, eval excluded)", out / "tradeoff_time.png")]
    if report.points and all(p.cost is not None for p in report.points):
        figures.append(_plot(report, curves.cost, "training cost ($)", out / "tradeoff_cost.png"))
    budgeted = [p for p in report.points if p.budgeted]
    if budgeted:
        unit = "$" if budgeted[0].budget_text.endswith("usd") else "s"
        figures.append(
            _plot(report, curves.budget, f"budget ({unit}, max_duration)", out / "tradeoff_budget.png", budgeted)
        )
    figures = [figure for figure in figures if figure]
    markdown = ["# trainrun report", ""]
    markdown += [f"![{figure.stem}]({figure.name})" for figure in figures] + [""]
    for section in sections:
        markdown += [f"## {section.title}", "", *_markdown_table(section), ""]
        markdown += [f"_{section.caption}_", ""] if section.caption else []
    markdown += [f"- note: {note}" for note in report.notes]
    atomic_write_text(out / "report.md", "\n".join(markdown).rstrip() + "\n")
    atomic_write_text(out / "report.csv", _points_csv(report))
    return [out / "report.md", out / "report.csv", *figures]


def _points_csv(report: Report) -> str:
    on_time, on_cost = report.on_time_frontier, report.on_cost_frontier
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        ["recipe", "budget", "epochs_mean", "seeds"]
        + [f"{report.quality_metric}_{stat}" for stat in ("mean", "sd", "min", "max")]
        + ["train_seconds_mean"]
        + ["train_seconds_sd", "cost_mean", "hardware", "time_source", "pareto_time", "pareto_cost"]
    )
    for p in report.points:
        low, high = p.quality_range
        hardware = "; ".join(sorted({r.pricing.hardware for r in p.runs}))
        writer.writerow(
            [p.label, p.budget_text, "" if p.epochs is None else f"{p.epochs:.4g}", p.seeds]
            + [f"{p.quality:.6f}", f"{p.quality_spread:.6f}", f"{low:.6f}", f"{high:.6f}"]
            + [f"{p.seconds:.3f}", f"{p.seconds_spread:.3f}", "" if p.cost is None else f"{p.cost:.6f}", hardware]
            + [p.time_source, int(p in on_time), int(p in on_cost)]
        )
    return buffer.getvalue()


def _plot(report: Report, axis, xlabel: str, path: Path, points: list[Point] | None = None) -> Path | None:
    """Accuracy against ``axis``: one curve per recipe with seed spread (sd), the frontier of the
    swept points marked and recipe=auto's runs as stars; ``points`` (default: all) are drawn."""
    points = report.points if points is None else points
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for label, curve in curves.by_label(points).items():
        ordered = sorted(curve, key=lambda p: p.budget)
        if label == AUTO:  # where recipe=auto landed: stars named by the recipe chosen
            ax.scatter(
                [axis(p) for p in ordered],
                [p.quality * 100 for p in ordered],
                marker="*",
                s=160,
                zorder=5,
                color="crimson",
                label="recipe=auto",
            )
            for p in ordered:
                chosen = "/".join(sorted({r.auto["chosen"] for r in p.runs}))
                ax.annotate(
                    f"auto: {chosen} ({p.budget_text})",
                    (axis(p), p.quality * 100),
                    textcoords="offset points",
                    xytext=(6, 6),
                    fontsize=7,
                    color="crimson",
                )
            continue
        ax.errorbar(
            [axis(p) for p in ordered],
            [p.quality * 100 for p in ordered],
            yerr=[p.quality_spread * 100 for p in ordered],
            xerr=[p.seconds_spread for p in ordered] if axis is curves.seconds else None,
            marker="o",
            capsize=3,
            label=label,
        )
        for p in ordered:
            where = (axis(p), p.quality * 100)
            ax.annotate(p.budget_text, where, textcoords="offset points", xytext=(4, -10), fontsize=7)
    frontier = curves.pareto([p for p in points if p.label != AUTO], axis)
    ax.plot(
        [axis(p) for p in frontier],
        [p.quality * 100 for p in frontier],
        linestyle="--",
        color="black",
        marker="s",
        markerfacecolor="none",
        markersize=10,
        label="Pareto frontier",
    )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"final {report.quality_label} (%)")
    ax.set_title("accuracy vs " + xlabel.split(" (")[0] + " (points named by budget)")
    ax.grid(alpha=0.3)
    ax.legend()
    figure.tight_layout()
    try:
        atomic_write(path, lambda handle: figure.savefig(handle, format="png"))
    finally:
        plt.close(figure)
    return path


# ----------------------------------------------------------------------------------------------
def _rich_table(section: Section) -> Table:
    table = Table(title=section.title, title_justify="left", caption=section.caption, caption_justify="left")
    for column in section.columns:
        table.add_column(column)
    for row in section.rows:
        table.add_row(*row)
    return table


def _markdown_table(section: Section) -> list[str]:
    if not section.rows:
        return ["(none)"]
    lines = ["| " + " | ".join(section.columns) + " |", "|" + "---|" * len(section.columns)]
    return lines + ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in section.rows]


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
