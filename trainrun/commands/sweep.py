"""``trainrun sweep``: one recipe trained at several budgets (and seeds, and cross-validation folds)
into one directory.

A budget is either a ``scale_schedule_ratio`` (a number: it stretches the run's length and every
time in its schedule) or a wall-clock or cost budget (``30s``, ``5min``, ``2usd``: it becomes the
run's ``max_duration``). Each (budget, seed) runs as its own ``trainrun`` process in
``OUT/ssr<ratio>-seed<seed>/`` or ``OUT/budget<budget>-seed<seed>/``; a run whose
``summary.json`` says it completed, with the same config, is reused rather than repeated, and an
interrupted one resumes from its newest checkpoint. Every job is composed and validated before the first one starts.

``folds=[0,1,2,3,4]`` (or ``folds=all``) trains each fold of a segmentation set's cross-validation
(``data.segmentation.fold``; budgets default to the recipe as written) into ``OUT/.../fold<k>``:
the report shows the folds as one entry (their mean, spread and range), and ``trainrun ensemble``
averages their predictions on a held-out set.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from rich.console import Console

from trainrun import run_files
from trainrun.atomic_io import atomic_write_json, read_json, read_yaml
from trainrun.children import run_trainrun
from trainrun.config import ConfigSource, override_key, override_value
from trainrun.core.time import Time, TimeUnit, budget_size, is_budget
from trainrun.errors import ConfigError
from trainrun.kinds import Capability, task_spec, tasks_offering
from trainrun.schema import TrainConfig

SWEEP_KEYS = ("budgets", "seeds", "folds", "out")
FOLD_KEY = "data.segmentation.fold"
RUN_ONLY_KEYS = ("progress", "resume")  # may differ between a finished run and its rerun


@dataclass(frozen=True)
class SweepJob:
    """One training run of a sweep."""

    budget: str  # as written: a schedule ratio or a wall-clock / cost budget
    seed: int | None
    run_dir: Path
    overrides: tuple[str, ...]
    fold: int | None = None

    @property
    def label(self) -> str:
        kind = "max_duration" if is_budget(self.budget) else "ssr"
        seed = f" seed={self.seed}" if self.seed is not None else ""
        return f"{kind}={self.budget}{seed}" + (f" fold={self.fold}" if self.fold is not None else "")


def parse_sweep_arguments(
    argv: list[str],
) -> tuple[list[str], list[int | None], Path | None, list[str], ConfigSource, str | None]:
    """(budgets, seeds, out, run overrides, where configs come from, folds as written) from
    ``trainrun sweep`` arguments."""
    from trainrun.config import locate, translate

    hydra_args, overrides, _ = translate(argv)
    source, hydra_args, overrides = locate(hydra_args, overrides)
    if hydra_args:
        raise ConfigError(f"'trainrun sweep' takes overrides only, not '{hydra_args[0]}'")
    settings, run_overrides = {}, []
    for override in overrides:
        key, _, value = override.partition("=")
        if key in SWEEP_KEYS:
            settings[key] = value
        else:
            run_overrides.append(override)
    if "budgets" not in settings and "folds" not in settings:
        raise ConfigError("'trainrun sweep' needs 'budgets', e.g. budgets=[0.25,0.5,1.0], or 'folds'")
    budgets = _budgets(settings.get("budgets", "1"))
    seeds: list[int | None] = [None]
    if "seeds" in settings:
        seeds = [_number(value, "seeds", int) for value in _values("seeds", settings["seeds"])]
    out = Path(settings["out"]) if "out" in settings else None
    swept = ("max_duration" if is_budget(budgets[0]) else "scale_schedule_ratio", "seed")
    swept += (FOLD_KEY,) if "folds" in settings else ()
    if any(override_key(o) in (*swept, "hydra.run.dir") for o in run_overrides):
        raise ConfigError(f"'trainrun sweep' sets {', '.join(swept)} and the run directory itself")
    return budgets, seeds, out, run_overrides, source, settings.get("folds")


def parse_folds(text: str | None, folds: int) -> list[int | None]:
    """The folds ``folds=`` names (``all``: each of the set's ``folds``), or one run without a fold."""
    if text is None:
        return [None]
    chosen = list(range(folds)) if text == "all" else [_number(value, "folds", int) for value in _values("folds", text)]
    if not chosen or any(fold < 0 or fold >= folds for fold in chosen):
        raise ConfigError(f"bad value for 'folds': {text} (all, or folds 0 to {folds - 1} of data.segmentation.folds)")
    return sorted(set(chosen))


def _budgets(text: str) -> list[str]:
    """The sweep's budgets, in increasing order: all schedule ratios, or all wall-clock / cost budgets."""
    values = _values("budgets", text)
    budgets = [str(value) for value in values if isinstance(value, str) and is_budget(value)]
    if budgets:
        if len(budgets) != len(values) or len({Time.parse(b).unit is TimeUnit.DOLLAR for b in budgets}) > 1:
            raise ConfigError(
                f"bad value for 'budgets': {text} (give schedule ratios, wall-clock budgets or cost budgets, one kind)"
            )
        if any(Time.parse(b).value <= 0 for b in budgets):
            raise ConfigError(f"bad value for 'budgets': {text} (budgets must be above zero)")
        return sorted(set(budgets), key=budget_size)
    ratios = [_number(value, "budgets", float) for value in values]
    if not ratios or any(ratio <= 0 for ratio in ratios):
        raise ConfigError(f"bad value for 'budgets': {text} (positive schedule ratios, or budgets such as 30s, 5min)")
    return [f"{ratio:g}" for ratio in sorted(set(ratios))]


def plan(
    budgets: list[str], seeds: list[int | None], out: Path, overrides: list[str], folds: list[int | None] = (None,)
) -> list[SweepJob]:
    """The jobs of a sweep, in budget order."""
    jobs = []
    for budget in budgets:
        for seed in seeds:
            for fold in folds:
                setting = f"max_duration={budget}" if is_budget(budget) else f"scale_schedule_ratio={budget}"
                name = ("budget" if is_budget(budget) else "ssr") + budget
                name += (f"-seed{seed}" if seed is not None else "") + (f"-fold{fold}" if fold is not None else "")
                extra = [setting] + ([f"seed={seed}"] if seed is not None else [])
                extra += [f"{FOLD_KEY}={fold}"] if fold is not None else []
                jobs.append(SweepJob(budget, seed, out / name, (*overrides, *extra), fold))
    return jobs


def finished(job: SweepJob, config_yaml: str) -> bool:
    """Whether ``job`` already ran to its end with this config.

    A run directory holding another config is an error, finished or not: resuming its
    checkpoint or mixing its results into the sweep would both be wrong.
    """
    summary_path, saved_path = job.run_dir / run_files.SUMMARY, job.run_dir / run_files.CONFIG
    if not saved_path.is_file():
        return False
    # a key the saved run's version of trainrun did not have yet: that run had its default
    saved = _schema_defaults() | _comparable(read_yaml(saved_path))
    wanted = _comparable(yaml.safe_load(config_yaml))
    if saved != wanted:
        key = next(k for k in sorted(set(saved) | set(wanted)) if saved.get(k) != wanted.get(k))
        raise ConfigError(
            f"'{job.run_dir}' holds a run with another config ({key}: {saved.get(key)} there, "
            f"{wanted.get(key)} now); choose another out= or remove it"
        )
    return summary_path.is_file() and read_json(summary_path).get("status") in ("completed", "profiled")


def run_sweep(argv: list[str]) -> int:
    """Entry point of ``trainrun sweep``; returns the exit code (1 if any run failed)."""
    from trainrun.config import compose
    from trainrun.validation import validate

    if argv[:1] in (["--help"], ["-h"]):
        print(f"usage: trainrun sweep [{' | '.join(f'{key}=...' for key in SWEEP_KEYS)}] [OVERRIDE ...]\n\n{__doc__}")
        return 0
    budgets, seeds, out, overrides, source, folds_text = parse_sweep_arguments(argv)
    base = validate(compose(overrides, source))
    out = out or Path("sweeps") / (base.name or "sweep")
    run_files.check_output_dir("out", str(out))
    if folds_text is not None and Capability.FOLDS not in task_spec(base.task.name).offers:
        tasks = " or ".join(f"task={name}" for name in tasks_offering({Capability.FOLDS}))
        raise ConfigError(f"bad value for 'folds': {folds_text} (cross-validation folds are {tasks}'s)")
    folds = parse_folds(folds_text, base.data.segmentation.folds)
    jobs = plan(budgets, seeds, out, overrides, folds)
    composed = {}
    for job in jobs:
        config = compose(list(job.overrides), source)
        validate(config)
        composed[job] = OmegaConf.to_yaml(config, resolve=True)
    reused = {job for job in jobs if finished(job, composed[job])}
    console = Console()
    console.print(f"sweep into {out}: {len(jobs)} runs ({len(reused)} already done)", highlight=False)
    statuses: dict[str, str] = {}
    for index, job in enumerate(jobs, 1):
        if job in reused:
            statuses[job.run_dir.name] = "reused"
            console.print(f"[{index}/{len(jobs)}] {job.label}: reused {job.run_dir}", highlight=False)
            continue
        console.print(f"[{index}/{len(jobs)}] {job.label}: training in {job.run_dir}", highlight=False)
        code = _train(job, source)
        statuses[job.run_dir.name] = "completed" if code == 0 else f"failed (exit {code})"
        atomic_write_json(out / "sweep.json", _record(budgets, seeds, folds, overrides, statuses))
        if code == 130:
            raise KeyboardInterrupt
    atomic_write_json(out / "sweep.json", _record(budgets, seeds, folds, overrides, statuses))
    failed = [name for name, status in statuses.items() if status.startswith("failed")]
    if failed:
        console.print(f"[red]{len(failed)} run(s) failed:[/] {', '.join(failed)}", highlight=False)
    from trainrun.commands.report import report_command

    report_command([str(out)])
    return 1 if failed else 0


def _train(job: SweepJob, source: ConfigSource) -> int:
    arguments = [*source.flags(), *source.overrides(list(job.overrides)), f"hydra.run.dir={job.run_dir}"]
    arguments += ["progress=false", "resume=auto"]
    return run_trainrun(arguments).returncode


def _record(budgets, seeds, folds, overrides, statuses) -> dict:
    record = {"budgets": budgets, "seeds": seeds, "overrides": list(overrides), "runs": statuses}
    return record | ({"folds": folds} if folds != [None] else {})


@functools.cache
def _schema_defaults() -> dict[str, object]:
    """Every schema default as flat dotted keys, once per process."""
    return _comparable(yaml.safe_load(OmegaConf.to_yaml(OmegaConf.structured(TrainConfig))))


def _comparable(config: object) -> dict[str, object]:
    """A config (as YAML reads it) as flat dotted keys, without the keys a rerun may change."""
    flat: dict[str, object] = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = node

    walk(config, "")
    return {k: v for k, v in flat.items() if k not in RUN_ONLY_KEYS}


def _values(key: str, text: str) -> list[object]:
    """A sweep setting's value(s), parsed by Hydra's override grammar: ``[0.25,0.5]`` or ``0.5``."""
    value = override_value(f"{key}={text}")
    return value if isinstance(value, list) else [value]


def _number(value: object, key: str, kind: type) -> float | int:
    expected = "number" if kind is float else "whole number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ConfigError(f"bad value for '{key}': '{value}' is not a {expected}")
    return kind(value)
