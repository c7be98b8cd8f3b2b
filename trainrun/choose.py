"""Choices made by measurement before a run: ``recipe=auto`` and ``-o1``.

Both time the user's own config here, each candidate as a ``trainrun`` process training its
whole schedule compressed into a few steps (:class:`Profiler`),
decide, write the decision with its evidence to the run directory (``auto.json``, ``o1.json``)
and the console, and hand the run the overrides they chose.

``recipe=auto`` (with a budget, ``max_duration=30min`` or ``50usd``): for each recipe of a
trade-off table — a ``trainrun report`` CSV of sweeps on the user's data, or the published
ResNet-50 points shipped with trainrun — the budget divided by the recipe's seconds per epoch
here gives the epochs it can afford; its quality at that many epochs is read off the table by
linear interpolation between measured points (beyond them it is extrapolated and marked so); the
recipe with the best predicted quality trains, to the budget, with the scale-schedule ratio of
those epochs.

``-o1``: the systems settings that change only numerics (precision, channels-last or BERT's
fused layers, ``torch.compile``, loader workers and batches ahead), tried one at a time from the user's config
(coordinate descent: each setting's fastest value is kept before the next is tried); a value is
kept only when its step is faster by more than :data:`NOISE` of the best so far.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from trainrun.config import AUTO_RECIPE, ConfigSource, compose, config_dir, group_options, override_key
from trainrun.core.accounts import train_seconds
from trainrun.core.time import Time
from trainrun.errors import ConfigError
from trainrun.files import atomic_write_json, read_jsonl
from trainrun.schema import TrainConfig, algorithm_tasks, budget_seconds, validate

PUBLISHED_TABLES = {("resnet50", 1000): Path(__file__).parent / "report" / "published" / "resnet50_imagenet.csv"}
NOISE = 0.03  # a setting must be this much faster to replace the one kept
# algorithms that change how a step runs, not what it computes: -o1 turns each on or off where its task has it
SYSTEMS_ALGORITHMS = ("channels_last", "fused_layers")


# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Profile:
    """What a profiled prefix measured."""

    seconds_per_step: float
    batches_per_epoch: int

    @property
    def seconds_per_epoch(self) -> float:
        return self.seconds_per_step * self.batches_per_epoch


class Profiler:
    """Times configs as ``trainrun`` processes in a scratch folder removed afterwards.

    Each trains its whole schedule compressed into ``steps`` steps (stopping one short of the
    end, which would evaluate), so a method whose step cost changes along the schedule —
    progressive resizing, selective backprop, layer freezing — is timed over all its phases; the
    first step (compilation, loader start) is left out of the average.
    """

    SETS = ("max_duration", "profile_prefix", "scale_schedule_ratio", "eval_interval", "progress", "hydra.run.dir")

    def __init__(self, source: ConfigSource, steps: int) -> None:
        self.source, self.steps = source, steps
        self.folder = Path(tempfile.mkdtemp(prefix="trainrun-profile-"))
        self.count = 0

    def __enter__(self) -> Profiler:
        return self

    def __exit__(self, *_: object) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def __call__(self, overrides: list[str]) -> Profile:
        """The seconds per step of ``overrides``; a failed profile raises naming its error."""
        self.count += 1
        run_dir = self.folder / str(self.count)
        kept = [
            o for o in overrides if override_key(o) not in self.SETS and not override_key(o).startswith("checkpoint.")
        ]
        settings = [f"max_duration={self.steps}ba", f"profile_prefix={self.steps - 1}ba", "scale_schedule_ratio=1"]
        settings += ["eval_interval=1000000000ba", "progress=false", "checkpoint.save_final=false"]
        settings += ["checkpoint.interval=null", f"hydra.run.dir={run_dir}"]
        arguments = [*self.source.flags(), *self.source.overrides([*kept, *settings])]
        result = subprocess.run([sys.executable, "-m", "trainrun", *arguments], capture_output=True, text=True)
        summary_path = run_dir / "summary.json"
        if result.returncode != 0 or not summary_path.is_file():
            lines = [line for line in result.stderr.splitlines() if line.strip()] or ["no output"]
            raise ProfileFailed(lines[-1].removeprefix("trainrun: error: "))
        summary = json.loads(summary_path.read_text())
        first_step = train_seconds(read_jsonl(run_dir / "steps.jsonl")[0])
        per_step = (summary["train_seconds"] - first_step) / max(summary["batches"] - 1, 1)
        return Profile(per_step, summary["batches_per_epoch"])


class ProfileFailed(Exception):
    """A candidate could not be timed here (its one-line error)."""


# ----------------------------------------------------------------------------------------------
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


def read_table(path: Path, metric: str) -> dict[str, list[TablePoint]]:
    """Points per recipe from a ``trainrun report`` CSV (rows whose budget is a schedule ratio)."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"bad value for 'auto.table': cannot read '{path}' ({error})") from None
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


def best_candidate(candidates: Iterable[Candidate]) -> Candidate:
    """The rule: the highest predicted quality; among equals an interpolated prediction before an
    extrapolated one, then the cheaper epoch. Candidates that could not be timed are skipped."""
    timed = [c for c in candidates if c.predicted_quality is not None]
    if not timed:
        raise ConfigError(
            "recipe=auto could not time any candidate here: "
            + "; ".join(f"{c.recipe}: {c.error}" for c in candidates if c.error)
        )
    return max(
        timed, key=lambda c: (round(c.predicted_quality, 9), c.prediction == "interpolated", -c.seconds_per_epoch)
    )


def plan_candidate(candidate: Candidate, points: list[TablePoint], profile: Profile, budget: float) -> None:
    """Fill in what ``candidate`` affords within ``budget`` seconds and the quality predicted for it."""
    base_epochs = statistics.median(p.epochs / p.ratio for p in points)  # the recipe's length at ratio 1
    candidate.seconds_per_epoch = profile.seconds_per_epoch
    candidate.affordable_epochs = budget / profile.seconds_per_epoch
    candidate.scale_schedule_ratio = float(f"{candidate.affordable_epochs / base_epochs:.4g}")
    prediction = predict(points, candidate.affordable_epochs)
    candidate.predicted_quality, candidate.prediction = prediction.quality, prediction.how


# ----------------------------------------------------------------------------------------------
@dataclass
class Trial:
    """One timed combination of ``-o1``."""

    settings: dict[str, str]
    seconds_per_step: float | None
    error: str | None = None
    kept: bool = False


@dataclass
class SystemsSearch:
    """``-o1``'s search: the settings tried, in order, and the trials."""

    start: dict[str, str]
    options: dict[str, list[str]]
    trials: list[Trial] = field(default_factory=list)

    def run(self, measure: Callable[[dict[str, str]], float]) -> dict[str, str]:
        """Coordinate descent from ``start``: per setting, keep the value whose step is fastest
        by more than :data:`NOISE`; return the settings that differ from ``start``."""
        best = dict(self.start)
        best_time = self._time(best, measure)
        if best_time is None:
            raise ConfigError(f"-o1 could not time the config as given: {self.trials[-1].error}")
        for key, values in self.options.items():
            for value in values:
                if value == best[key]:
                    continue
                trial_settings = {**best, key: value}
                seconds = self._time(trial_settings, measure)
                if seconds is not None and seconds < best_time * (1 - NOISE):
                    best, best_time = trial_settings, seconds
        next(trial for trial in self.trials if trial.settings == best).kept = True
        return {key: value for key, value in best.items() if value != self.start[key]}

    def _time(self, settings: dict[str, str], measure: Callable[[dict[str, str]], float]) -> float | None:
        try:
            seconds = measure(settings)
        except ProfileFailed as failure:
            self.trials.append(Trial(dict(settings), None, str(failure)))
            return None
        self.trials.append(Trial(dict(settings), seconds))
        return seconds


def systems_options(config: TrainConfig, cpu_count: int) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(the config's own value, the values to try) of each setting ``-o1`` may change here."""
    import torch

    on_gpu = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    start = {"precision": config.precision, "compile": str(config.compile).lower()}
    options = {"precision": ["fp32", "amp", "bf16"] if on_gpu else ["fp32", "bf16"], "compile": ["false", "true"]}
    for name in SYSTEMS_ALGORITHMS:
        if config.task.name in algorithm_tasks(name):
            start[name] = str(name in config.algorithms).lower()
            options[name] = ["false", "true"]
    workers = sorted({0, 2, max(cpu_count // _ranks_per_node(config, on_gpu), 1), config.data.num_workers})
    start["data.num_workers"] = str(config.data.num_workers)
    options["data.num_workers"] = [str(w) for w in workers]
    if config.data.loader == "ffcv":
        start["data.batches_ahead"] = str(config.data.batches_ahead)
        options["data.batches_ahead"] = sorted({"1", "3", "5", str(config.data.batches_ahead)}, key=int)
    return start, options


def _ranks_per_node(config: TrainConfig, on_gpu: bool) -> int:
    import torch

    if config.launcher.devices != "auto":
        return int(config.launcher.devices)
    return max(torch.cuda.device_count(), 1) if on_gpu else 1


def apply_settings(overrides: list[str], settings: dict[str, str], algorithms: list[str]) -> list[str]:
    """``overrides`` with ``settings`` applied, each replacing the user's own override of its key
    (a systems algorithm is toggled in the run's list of algorithms)."""
    toggled = {key: value == "true" for key, value in settings.items() if key in SYSTEMS_ALGORITHMS}
    keys = {"algorithms" if key in toggled else key for key in settings}
    kept = [o for o in overrides if override_key(o) not in keys]
    kept += [f"{key}={value}" for key, value in settings.items() if key not in toggled]
    if toggled:
        names = [name for name in algorithms if name not in toggled]
        names += [name for name, on in toggled.items() if on]
        kept.append(f"algorithms=[{','.join(names)}]")
    return kept


# ----------------------------------------------------------------------------------------------
def before_run(overrides: list[str], source: ConfigSource, optimize: bool, console: Console) -> list[str]:
    """Run ``recipe=auto`` and/or ``-o1``; return the run's overrides with their choices applied."""
    run_dir = _run_dir(overrides)
    overrides = [o for o in overrides if not o.startswith("hydra.run.dir=")] + [f"hydra.run.dir={run_dir}"]
    decisions: dict[str, dict] = {}
    if AUTO_RECIPE in overrides:
        overrides, decisions["auto.json"] = _choose_recipe(overrides, source, console)
    if optimize:
        overrides, decisions["o1.json"] = _choose_systems(overrides, source, console)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, decision in decisions.items():
        atomic_write_json(run_dir / name, decision)
        console.print(f"wrote {run_dir / name}", highlight=False)
    return overrides


def _run_dir(overrides: list[str]) -> Path:
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    if given:
        return Path(given[-1])
    # Hydra's default, conf/config.yaml's hydra.run.dir (runs/${now:%Y-%m-%d}/...), resolved now
    pattern = yaml.safe_load((config_dir() / "config.yaml").read_text())["hydra"]["run"]["dir"]
    now = datetime.now()
    return Path(re.sub(r"\$\{now:([^}]*)\}", lambda match: now.strftime(match.group(1)), pattern))


def _choose_recipe(overrides: list[str], source: ConfigSource, console: Console) -> tuple[list[str], dict]:
    rest = [o for o in overrides if o != AUTO_RECIPE]
    if any(override_key(o) == "scale_schedule_ratio" for o in rest):
        raise ConfigError("recipe=auto sets scale_schedule_ratio itself (from the budget); leave it out")
    config = validate(compose(rest, source))
    budget = Time.parse(config.max_duration)
    if not budget.unit.is_budget:
        raise ConfigError(
            f"recipe=auto needs a budget: max_duration={config.max_duration} is an amount of training; "
            "give wall-clock time or money, e.g. max_duration=30min or max_duration=50usd"
        )
    table_path, table_name = _table(config)
    metric = _quality_metric(config)
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
    chosen = best_candidate(candidates)
    decision = {
        "budget": config.max_duration,
        "budget_seconds": seconds,
        "table": table_name,
        "rule": "the highest predicted quality at the epochs the budget affords here; among equals an "
        "interpolated prediction before an extrapolated one, then the cheaper epoch",
        "candidates": [asdict(c) for c in candidates],
        "chosen": chosen.recipe,
        "scale_schedule_ratio": chosen.scale_schedule_ratio,
        "predicted_quality": chosen.predicted_quality,
        "quality_metric": metric,
    }
    console.print(_recipe_table(candidates, chosen, metric))
    if chosen.prediction != "interpolated":
        console.print(f"[yellow]note:[/] {chosen.recipe}'s quality is {chosen.prediction}", highlight=False)
    run = [o for o in rest if not o.startswith("recipe=")]
    return [*run, f"recipe={chosen.recipe}", f"scale_schedule_ratio={chosen.scale_schedule_ratio}"], decision


def _quality_metric(config: TrainConfig) -> str:
    from trainrun.tasks import build_task

    return build_task(config.task.name).quality


def _table(config: TrainConfig) -> tuple[Path, str]:
    if config.auto.table:
        path = Path(config.auto.table).expanduser()
        if not path.is_file():
            raise ConfigError(f"bad value for 'auto.table': '{config.auto.table}' does not exist")
        return path, str(path)
    published = PUBLISHED_TABLES.get((config.model.name, config.model.num_classes))
    if published is None:
        raise ConfigError(
            f"recipe=auto needs a trade-off table for model={config.model.name} with {config.model.num_classes} "
            "classes and trainrun publishes none: sweep the recipes on your data ('trainrun sweep recipe=NAME "
            "budgets=[...]' per recipe, then 'trainrun report DIRS') and pass auto.table=REPORT_DIR/report.csv"
        )
    return published, f"the published table {published.name}"


def _recipe_table(candidates: list[Candidate], chosen: Candidate, metric: str) -> Table:
    table = Table(title="recipe=auto", title_justify="left")
    for column in ("recipe", "s / epoch here", "epochs affordable", "ssr", f"predicted {metric}", "how", ""):
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
            f"{c.predicted_quality:.2%}",
            c.prediction,
            "chosen" if c is chosen else "",
        )
    return table


def _choose_systems(overrides: list[str], source: ConfigSource, console: Console) -> tuple[list[str], dict]:
    config = validate(compose(overrides, source))
    start, options = systems_options(config, os.cpu_count() or 1)
    console.print(
        f"-o1: timing {', '.join(options)} (the schedule compressed into {config.auto.profile_steps} steps per trial)",
        highlight=False,
    )
    search = SystemsSearch(start, options)
    with Profiler(source, config.auto.profile_steps) as profile:

        def measure(settings: dict[str, str]) -> float:
            return profile(apply_settings(overrides, settings, list(config.algorithms))).seconds_per_step

        changes = search.run(measure)
    table = Table(title="-o1 trials", title_justify="left")
    for column in (*options, "s / step", ""):
        table.add_column(column)
    for trial in search.trials:
        timing = f"{trial.seconds_per_step:.4g}" if trial.seconds_per_step is not None else f"failed: {trial.error}"
        table.add_row(*(trial.settings[key] for key in options), timing, "kept" if trial.kept else "")
    console.print(table)
    console.print(
        "-o1: " + (", ".join(f"{k}={v}" for k, v in changes.items()) if changes else "the config as given is fastest"),
        highlight=False,
    )
    decision = {
        "start": start,
        "options": options,
        "noise": NOISE,
        "trials": [asdict(trial) for trial in search.trials],
        "changes": changes,
    }
    return apply_settings(overrides, changes, list(config.algorithms)), decision
