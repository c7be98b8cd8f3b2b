"""``recipe=auto``: the recipe whose predicted quality at the epochs a budget affords here is best."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from trainrun.choose.profiling import Profile, ProfileFailed, Profiler
from trainrun.config import AUTO_RECIPE, ConfigSource, compose, group_options, override_key
from trainrun.core.time import Time
from trainrun.errors import ConfigError
from trainrun.kinds import Capability, specs, task_spec
from trainrun.quality import TOP1, Quality
from trainrun.schema import TrainConfig, budget_seconds
from trainrun.validation import validate

PUBLISHED_TABLES = {("resnet50", 1000): Path(__file__).parent.parent / "report" / "published" / "resnet50_imagenet.csv"}


@dataclass(frozen=True)
class TablePoint:
    """A recipe's measured quality at a number of epochs."""

    epochs: float
    quality: float
    ratio: float  # the scale-schedule ratio that trained those epochs


@dataclass(frozen=True)
class Prediction:
    quality: float
    how: str  # "interpolated", "extrapolated above the table", "extrapolated below the table"

    @property
    def extrapolated(self) -> bool:
        return self.how != "interpolated"


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a ``trainrun report`` CSV; a file that cannot be read is a one-line error."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ConfigError(f"bad value for 'auto.table': cannot read '{path}' ({error})") from None


def read_table(path: Path, metric: str) -> dict[str, list[TablePoint]]:
    """Points per recipe from a ``trainrun report`` CSV (rows whose budget is a schedule ratio)."""
    rows = read_rows(path)
    needed = ("recipe", "budget", "epochs_mean", f"{metric}_mean")
    if not rows or any(column not in rows[0] for column in needed):
        raise ConfigError(
            f"bad value for 'auto.table': '{path}' is not a trainrun report CSV with {', '.join(needed)} "
            "(write one with 'trainrun report SWEEP_DIRS')"
        )
    table: dict[str, list[TablePoint]] = {}
    for row in rows:
        try:
            ratio, epochs, quality = float(row["budget"]), float(row["epochs_mean"]), float(row[f"{metric}_mean"])
        except ValueError:
            continue  # a wall-clock budget's row: its epochs depend on the machine that ran it
        table.setdefault(row["recipe"], []).append(TablePoint(epochs, quality, ratio))
    if not table:
        raise ConfigError(f"bad value for 'auto.table': '{path}' has no points at schedule ratios")
    return {recipe: sorted(points, key=lambda p: p.epochs) for recipe, points in table.items()}


def predict(points: list[TablePoint], epochs: float) -> Prediction:
    """Quality at ``epochs`` read off ``points`` (sorted by epochs): linear between measured points;
    beyond the longest it is held at that point's quality, below the shortest extended along the
    two shortest (one point: its quality), never below zero."""
    first, last = points[0], points[-1]
    if epochs > last.epochs:
        return Prediction(last.quality, "extrapolated above the table")
    if epochs < first.epochs:
        if len(points) == 1:
            return Prediction(first.quality, "extrapolated below the table")
        second = points[1]
        slope = (second.quality - first.quality) / (second.epochs - first.epochs)
        return Prediction(max(first.quality - slope * (first.epochs - epochs), 0.0), "extrapolated below the table")
    for low, high in zip(points, points[1:]):
        if low.epochs <= epochs <= high.epochs:
            share = (epochs - low.epochs) / (high.epochs - low.epochs) if high.epochs > low.epochs else 1.0
            return Prediction(low.quality + share * (high.quality - low.quality), "interpolated")
    return Prediction(first.quality, "interpolated")  # a single point, exactly at its epochs


@dataclass
class Candidate:
    """A recipe considered by ``recipe=auto`` and what was measured and predicted for it."""

    recipe: str
    seconds_per_epoch: float | None = None
    affordable_epochs: float | None = None
    scale_schedule_ratio: float | None = None
    predicted_quality: float | None = None
    prediction: str | None = None
    error: str | None = None


def best_candidate(candidates: Iterable[Candidate], rule: Quality = TOP1) -> Candidate:
    """The rule: the best predicted quality (highest accuracy, lowest loss: ``rule``); among equals
    an interpolated prediction before an extrapolated one, then the cheaper epoch. Candidates that
    could not be timed are skipped."""
    timed = [c for c in candidates if c.predicted_quality is not None]
    if not timed:
        raise ConfigError(
            "recipe=auto could not time any candidate here: "
            + "; ".join(f"{c.recipe}: {c.error}" for c in candidates if c.error)
        )
    return max(
        timed,
        key=lambda c: (round(rule.key(c.predicted_quality), 9), c.prediction == "interpolated", -c.seconds_per_epoch),
    )


def plan_candidate(candidate: Candidate, points: list[TablePoint], profile: Profile, budget: float) -> None:
    """Fill in what ``candidate`` affords within ``budget`` seconds and the quality predicted for it."""
    base_epochs = statistics.median(p.epochs / p.ratio for p in points)  # the recipe's length at ratio 1
    candidate.seconds_per_epoch = profile.seconds_per_epoch
    candidate.affordable_epochs = budget / profile.seconds_per_epoch
    candidate.scale_schedule_ratio = float(f"{candidate.affordable_epochs / base_epochs:.4g}")
    prediction = predict(points, candidate.affordable_epochs)
    candidate.predicted_quality, candidate.prediction = prediction.quality, prediction.how


def choose_recipe(overrides: list[str], source: ConfigSource, console: Console) -> tuple[list[str], dict]:
    rest = [o for o in overrides if o != AUTO_RECIPE]
    if any(override_key(o) == "scale_schedule_ratio" for o in rest):
        raise ConfigError("recipe=auto sets scale_schedule_ratio itself (from the budget); leave it out")
    config = _run_config(rest, source)
    budget = Time.parse(config.max_duration)
    if not budget.unit.is_budget:
        raise ConfigError(
            f"recipe=auto needs a budget: max_duration={config.max_duration} is an amount of training; "
            "give wall-clock time or money, e.g. max_duration=30min or max_duration=50usd"
        )
    table_path, table_name = _table(config)
    rule = _quality_rule(config)
    metric = rule.metric
    table = read_table(table_path, metric)
    recipes = group_options("recipe", source)
    wanted = config.auto.candidates or sorted(table)
    unknown = [name for name in wanted if name not in table or name not in recipes]
    if unknown:
        raise ConfigError(
            f"bad value for 'auto.candidates': '{unknown[0]}' is not both a recipe here and a recipe of "
            f"{table_name} (those are: {', '.join(sorted(set(table) & set(recipes))) or 'none'})"
        )
    seconds = budget_seconds(config)
    candidates = [Candidate(name) for name in wanted]
    without_budget = [o for o in rest if override_key(o) != "max_duration"]
    console.print(
        f"recipe=auto: timing {len(candidates)} recipe(s) for {config.max_duration} "
        f"({seconds:.0f} s of training), each over its schedule compressed into {config.auto.profile_steps} steps",
        highlight=False,
    )
    with Profiler(source, config.auto.profile_steps) as profile:
        for candidate in candidates:
            candidate_overrides = [*without_budget, f"recipe={candidate.recipe}"]
            validate(compose(candidate_overrides, source))
            try:
                timing = profile(candidate_overrides)
            except ProfileFailed as failure:
                candidate.error = str(failure)
                continue
            plan_candidate(candidate, table[candidate.recipe], timing, seconds)
    chosen = best_candidate(candidates, rule)
    decision = {
        "budget": config.max_duration,
        "budget_seconds": seconds,
        "table": table_name,
        "rule": f"the best predicted quality ({rule.direction}) at the epochs the budget affords here; among equals an "
        "interpolated prediction before an extrapolated one, then the cheaper epoch",
        "candidates": [asdict(c) for c in candidates],
        "chosen": chosen.recipe,
        "scale_schedule_ratio": chosen.scale_schedule_ratio,
        "predicted_quality": chosen.predicted_quality,
        "quality_metric": metric,
    }
    console.print(_recipe_table(candidates, chosen, rule))
    if chosen.prediction != "interpolated":
        console.print(f"[yellow]note:[/] {chosen.recipe}'s quality is {chosen.prediction}", highlight=False)
    run = [o for o in rest if not o.startswith("recipe=")]
    return [*run, f"recipe={chosen.recipe}", f"scale_schedule_ratio={chosen.scale_schedule_ratio}"], decision


def _run_config(rest: list[str], source: ConfigSource) -> TrainConfig:
    """The run's config for the checks made before any candidate is timed. With a table of the
    user's, it is composed with the first candidate's recipe: the recipes may set what the rest of
    the command needs (a GPT table's recipes set task=causal_lm), and every candidate's own config is
    checked again before it is timed."""
    given = compose(rest, source)
    first = _first_candidate(given.auto.candidates, given.auto.table)
    if first is not None and first in group_options("recipe", source):
        with_first = compose([*rest, f"recipe={first}"], source)
        if given.auto.table and with_first.task.name == given.task.name:  # the table's runs are of another
            _check_table_task(Path(given.auto.table).expanduser(), given.task.name)  # task: that, not a symptom
        try:
            return validate(with_first)
        except ConfigError as error:
            if with_first.task.name == given.task.name:
                raise
            where = f"auto.table '{given.auto.table}'" if given.auto.table else "auto.candidates"
            raise ConfigError(  # the command's own settings are for another task than the recipes'
                f"{where} holds recipes of task {with_first.task.name} ({first} sets it), not "
                f"{given.task.name}: {error}"
            ) from error
    return validate(given)


def _check_table_task(table: Path, task: str) -> None:
    """A table of another task's runs (its quality column another metric's) is refused, naming both
    tasks, before a recipe of it is checked with this run's settings."""
    rows = read_rows(table)
    metric = task_spec(task).quality.metric
    if not rows or f"{metric}_mean" in rows[0]:
        return  # fits, or read_table names what it lacks
    measured = [name for name, spec in specs("task").items() if f"{spec.quality.metric}_mean" in rows[0]]
    holds = f"runs of task {' or '.join(measured)}" if measured else "no task's quality column"
    raise ConfigError(
        f"bad value for 'auto.table': '{table}' holds {holds}, and this run is task {task} (its quality column "
        f"{metric}_mean): pass a table of {task} runs ('trainrun report' of their sweeps)"
    )


def _first_candidate(candidates: list[str] | None, table: str | None) -> str | None:
    """The first recipe ``recipe=auto`` will time: the first of ``auto.candidates``, else the first
    by name in the table's recipe column (None when there is neither; an unreadable table is
    reported by :func:`read_table`)."""
    if candidates:
        return candidates[0]
    if not table:
        return None
    try:
        names = {row.get("recipe") for row in read_rows(Path(table).expanduser())} - {None, ""}
    except ConfigError:
        return None  # the run's own checks name the table (a missing file as missing), read_table the rest
    return min(names, default=None)


def _quality_rule(config: TrainConfig) -> Quality:
    return task_spec(config.task.name).quality


def _table(config: TrainConfig) -> tuple[Path, str]:
    if config.auto.table:
        path = Path(config.auto.table).expanduser()
        if not path.is_file():
            raise ConfigError(f"bad value for 'auto.table': '{config.auto.table}' does not exist")
        return path, str(path)
    published = PUBLISHED_TABLES.get((config.model.name, config.model.num_classes))
    if published is None:
        per_class = Capability.CLASS_IMAGES in task_spec(config.task.name).offers
        classes = f"with {config.model.num_classes} classes" if per_class else ""
        setting = classes or f"on task {config.task.name}"
        raise ConfigError(
            f"recipe=auto needs a trade-off table for model={config.model.name} {setting} "
            "and trainrun publishes none: sweep the recipes on your data ('trainrun sweep recipe=NAME "
            "budgets=[...]' per recipe, then 'trainrun report DIRS') and pass auto.table=REPORT_DIR/report.csv"
        )
    return published, f"the published table {published.name}"


def _recipe_table(candidates: list[Candidate], chosen: Candidate, rule: Quality) -> Table:
    table = Table(title="recipe=auto", title_justify="left")
    for column in ("recipe", "s / epoch here", "epochs affordable", "ssr", f"predicted {rule.metric}", "how", ""):
        table.add_column(column)
    for c in candidates:
        if c.error:
            table.add_row(c.recipe, "-", "-", "-", "-", f"not timed: {c.error}", "")
            continue
        table.add_row(
            c.recipe,
            f"{c.seconds_per_epoch:.3g}",
            f"{c.affordable_epochs:.3g}",
            f"{c.scale_schedule_ratio:g}",
            rule.format(c.predicted_quality),
            c.prediction,
            "chosen" if c is chosen else "",
        )
    return table
