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
from pathlib import Path

from rich.console import Console
from rich.table import Table

from trainrun.atomic_io import atomic_write_text
from trainrun.errors import ConfigError
from trainrun.loggers.mlflow_store import log_report
from trainrun.report import curves
from trainrun.report.plots import plot_tradeoff
from trainrun.report.runs import chosen_baseline, find_runs, load_run, pricing_from_flags
from trainrun.report.sections import Report, Section, build_sections
from trainrun.run_files import check_output_dir


def report_command(argv: list[str]) -> int:
    """Entry point of ``trainrun report``."""
    args = _parser().parse_args(argv)
    out = args.out or (args.dirs[0] if len(args.dirs) == 1 else Path("report"))
    check_output_dir("--out", str(out))  # before any run is read
    pricing = pricing_from_flags(args.hardware, args.price_per_hour)
    runs, notes = [], []
    for path in find_runs(args.dirs):
        run, note = load_run(path, args.first_epoch_as_second, pricing)
        runs.append(run)
        notes += [note] if note else []
    runs.sort(key=lambda run: (run.label, run.budgeted, run.budget, run.seed, str(run.path)))  # 5s before 10s
    metrics = sorted({run.rule.metric for run in runs})
    if len(metrics) > 1:
        raise ConfigError(f"the runs measure different quality metrics ({', '.join(metrics)}): report each task apart")
    all_points = curves.points(r for r in runs if r.status == "completed")
    recipes = sorted({p.label for p in all_points})
    baseline = chosen_baseline(args.baseline, recipes)
    targets = args.targets or sorted({t for r in runs for t in r.quality_targets})
    report = Report(runs, all_points, baseline, targets, notes)
    sections = build_sections(report)
    console = Console(width=None if sys.stdout.isatty() else 200)
    for section in sections:
        console.print(_rich_table(section))
    for note in notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    written = write_report(report, sections, out)
    console.print(f"wrote {', '.join(str(path) for path in written)}", highlight=False)
    for line in log_report([run.path for run in runs], out, written):  # runs tracked in MLflow: it goes there too
        console.print(line, highlight=False)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainrun report",
        description="Trade-off curves, time- and cost-to-accuracy and bottlenecks of finished runs and sweeps.",
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="run, sweep or multirun directories")
    parser.add_argument("--baseline", help="the label the speed-ups are measured against (default: 'baseline')")
    parser.add_argument(
        "--targets", type=_fractions, help="accuracies to time, e.g. 0.9,0.95 (default: the runs' quality_targets)"
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


def write_report(report: Report, sections: list[Section], out: Path) -> list[Path]:
    """report.md, report.csv and the trade-off plots, each written atomically."""
    out.mkdir(parents=True, exist_ok=True)
    figures = [plot_tradeoff(report, curves.seconds, "training time (s, eval excluded)", out / "tradeoff_time.png")]
    if report.points and all(p.cost is not None for p in report.points):
        figures.append(plot_tradeoff(report, curves.cost, "training cost ($)", out / "tradeoff_cost.png"))
    budgeted = [p for p in report.points if p.budgeted]
    if budgeted:
        unit = "$" if budgeted[0].budget_text.endswith("usd") else "s"
        figures.append(
            plot_tradeoff(
                report, curves.budget, f"budget ({unit}, max_duration)", out / "tradeoff_budget.png", budgeted
            )
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
        + [f"{report.rule.metric}_{stat}" for stat in ("mean", "sd", "min", "max")]
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
