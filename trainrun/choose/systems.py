"""``-o1``: coordinate descent over the systems settings that change only numerics, each trial timed."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from rich.console import Console
from rich.table import Table

from trainrun.algorithms.specs import SPECS
from trainrun.choose.profiling import ProfileFailed, Profiler
from trainrun.config import ConfigSource, compose, override_key
from trainrun.errors import ConfigError
from trainrun.kinds import offers
from trainrun.schema import TrainConfig
from trainrun.validation import validate

NOISE = 0.03  # a setting must be this much faster to replace the one kept
SYSTEMS_METHODS = tuple(name for name, spec in SPECS.items() if spec.systems)


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
    for name in SYSTEMS_METHODS:  # -o1 turns each on or off where the run has what it needs
        if SPECS[name].applies_to(offers(config)):
            start[name] = str(name in config.algorithms).lower()
            options[name] = ["false", "true"]
    workers = sorted({0, 2, max(cpu_count // _ranks_per_node(config, on_gpu), 1), config.data.num_workers})
    start["data.num_workers"] = str(config.data.num_workers)
    options["data.num_workers"] = [str(w) for w in workers]
    if config.data.loader == "ffcv":
        start["data.ffcv.batches_ahead"] = str(config.data.ffcv.batches_ahead)
        options["data.ffcv.batches_ahead"] = sorted({"1", "3", "5", str(config.data.ffcv.batches_ahead)}, key=int)
    return start, options


def _ranks_per_node(config: TrainConfig, on_gpu: bool) -> int:
    import torch

    if config.launcher.devices != "auto":
        return int(config.launcher.devices)
    return max(torch.cuda.device_count(), 1) if on_gpu else 1


def apply_settings(overrides: list[str], settings: dict[str, str], algorithms: list[str]) -> list[str]:
    """``overrides`` with ``settings`` applied, each replacing the user's own override of its key
    (a systems algorithm is toggled in the run's list of algorithms)."""
    toggled = {key: value == "true" for key, value in settings.items() if key in SYSTEMS_METHODS}
    keys = {"algorithms" if key in toggled else key for key in settings}
    kept = [o for o in overrides if override_key(o) not in keys]
    kept += [f"{key}={value}" for key, value in settings.items() if key not in toggled]
    if toggled:
        names = [name for name in algorithms if name not in toggled]
        names += [name for name, on in toggled.items() if on]
        kept.append(f"algorithms=[{','.join(names)}]")
    return kept


def choose_systems(overrides: list[str], source: ConfigSource, console: Console) -> tuple[list[str], dict]:
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
