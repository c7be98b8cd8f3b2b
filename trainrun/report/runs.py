"""Finished runs read back from disk, with the timing rules a report applies to them.

A run is any directory with a ``summary.json`` (and the ``config.yaml`` beside it); sweeps,
Hydra multiruns and single runs are all found by walking the directories given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainrun import run_files
from trainrun.atomic_io import read_json, read_jsonl, read_yaml
from trainrun.core.accounts import train_seconds
from trainrun.core.time import budget_size, is_budget
from trainrun.errors import ConfigError
from trainrun.quality import Quality

MEASURED, EXTRAPOLATED = "measured", "extrapolated"
AUTO = "auto"  # the label of runs whose recipe recipe=auto chose
FIRST_EPOCH_AS_SECOND = "measured, epoch 1 timed as epoch 2"


@dataclass(frozen=True)
class Pricing:
    """Dollars per node-hour and the name it goes by."""

    hardware: str
    price_per_hour: float | None


@dataclass(eq=False)
class Run:
    """One run's outcome as a report needs it."""

    path: Path
    label: str
    budget: float  # the scale-schedule ratio, or a budgeted run's training seconds (or dollars)
    seed: int
    status: str
    quality: float | None  # the final value of its quality metric (:attr:`rule`)
    train_seconds: float | None
    time_source: str
    nodes: int
    pricing: Pricing
    quality_targets: tuple[float, ...]
    summary: dict[str, Any] = field(repr=False)
    budget_text: str = ""  # the budget as written: "0.5" (a ratio) or "30s" (max_duration)
    budgeted: bool = False  # trained to a wall-clock or cost budget rather than a schedule ratio
    epochs: float | None = None
    auto: dict[str, Any] | None = field(default=None, repr=False)  # recipe=auto's decision (auto.json)
    config: dict[str, Any] = field(default_factory=dict, repr=False)  # its config.yaml

    @property
    def rule(self) -> Quality:
        """The run's quality metric and its direction, as its summary records them."""
        return Quality.from_summary(self.summary)

    @property
    def cost(self) -> float | None:
        """Dollars for the training time on the run's hardware, or None without a price."""
        if self.pricing.price_per_hour is None or self.train_seconds is None:
            return None
        return self.train_seconds / 3600 * self.pricing.price_per_hour * self.nodes


def pricing_from_flags(hardware: str | None, price: float | None) -> Pricing | None:
    """The price ``--hardware`` (a conf/hardware option) or ``--price-per-hour`` sets for every run,
    or None to price each run as its own config did."""
    if price is not None:
        if price < 0:
            raise ConfigError(f"bad value for '--price-per-hour': {price} (must be >= 0)")
        return Pricing(hardware or "custom", price)
    if hardware is None:
        return None
    from trainrun.config import compose, group_options
    from trainrun.validation import validate

    options = group_options("hardware")
    if hardware not in options:
        raise ConfigError(f"unknown option '{hardware}' for 'hardware' (choose from: {', '.join(options)})")
    chosen = validate(compose([f"hardware={hardware}"])).hardware
    return Pricing(chosen.name, chosen.price_per_hour)


def chosen_baseline(given: str | None, labels: list[str]) -> str | None:
    """The recipe speed-ups are measured against: ``--baseline`` as given, else the one labelled
    'baseline' where there is one; a label no run has is one line."""
    baseline = given if given is not None else ("baseline" if "baseline" in labels else None)
    if baseline is not None and baseline not in labels:
        raise ConfigError(f"bad value for '--baseline': '{baseline}' (recipes: {', '.join(labels) or 'none'})")
    return baseline


def find_runs(paths: list[Path]) -> list[Path]:
    """Every run directory (one holding summary.json) at or under ``paths``, in order; each path
    must hold at least one (a mistyped folder is an error, not an empty curve)."""
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise ConfigError(f"'{path}' does not exist")
        if not path.is_dir():
            raise ConfigError(f"'{path}' is not a directory (give run or sweep directories)")
        here = sorted(summary.parent for summary in path.rglob(run_files.SUMMARY))
        if not here:
            raise ConfigError(f"'{path}' is not a run: no {run_files.SUMMARY} in it or under it")
        found += here
    return _one_folder_per_run(list(dict.fromkeys(found)))


def _one_folder_per_run(folders: list[Path]) -> list[Path]:
    """``folders`` without copies of a run (MLflow's artifact store, a folder copied by hand): folders
    whose summaries are the same bytes are one run, read from the folder trainrun trained in (the
    one with the step log that no copy carries), else the first."""
    by_summary: dict[bytes, list[Path]] = {}
    for folder in folders:
        by_summary.setdefault((folder / run_files.SUMMARY).read_bytes(), []).append(folder)
    kept = {min(same, key=lambda folder: not (folder / run_files.STEPS).is_file()) for same in by_summary.values()}
    return [folder for folder in folders if folder in kept]


def load_run(path: Path, first_epoch_as_second: bool = False, pricing: Pricing | None = None) -> tuple[Run, str | None]:
    """The run in ``path`` and, when a timing rule could not be applied, a note saying why."""
    summary = read_json(path / run_files.SUMMARY)
    config_path = path / run_files.CONFIG
    config = (read_yaml(config_path) if config_path.is_file() else None) or {}
    hardware = config.get("hardware") or {}
    seconds, source, note = summary.get("train_seconds"), MEASURED, None
    metric = Quality.from_summary(summary).metric
    if summary.get("status") == "profiled" and summary.get("extrapolated"):
        seconds, source = summary["extrapolated"]["train_seconds"], EXTRAPOLATED
    elif first_epoch_as_second and seconds is not None:
        adjusted = _first_epoch_as_second(path, summary)
        if adjusted is None:
            note = f"{path}: epoch 1 kept as measured (needs steps.jsonl and two full epochs)"
        else:
            seconds, source = adjusted, FIRST_EPOCH_AS_SECOND
    ratio = float(config.get("scale_schedule_ratio", 1.0))
    max_duration = str(config.get("max_duration", ""))
    budgeted = is_budget(max_duration)
    auto_path = path / run_files.AUTO_DECISION
    auto = read_json(auto_path) if auto_path.is_file() else None
    run = Run(
        path=path,
        label=AUTO if auto else (config.get("name") or "unnamed"),
        budget=budget_size(max_duration) if budgeted else ratio,
        seed=config.get("seed", 0),
        status=summary.get("status", "unknown"),
        quality=summary.get(f"final_{metric}"),
        train_seconds=seconds,
        time_source=source,
        nodes=int((config.get("launcher") or {}).get("nnodes", 1)),
        pricing=pricing or Pricing(hardware.get("name", "unpriced"), hardware.get("price_per_hour")),
        # runs written before the rename, or with the former key, set accuracy_targets
        quality_targets=tuple(config.get("accuracy_targets") or config.get("quality_targets") or ()),
        summary=summary,
        budget_text=max_duration if budgeted else f"{ratio:g}",
        budgeted=budgeted,
        epochs=summary.get("epochs"),
        auto=auto,
        config=config,
    )
    return run, note


def _first_epoch_as_second(path: Path, summary: dict[str, Any]) -> float | None:
    """Training seconds with the first epoch's time replaced by the second's (one-off warm-up)."""
    per_epoch = summary.get("batches_per_epoch")
    rows = read_jsonl(path / run_files.STEPS)
    if not per_epoch or len(rows) < 2 * per_epoch or rows[0]["step"] != 1:
        return None
    epoch_seconds = [0.0, 0.0]
    for row in rows[: 2 * per_epoch]:
        epoch_seconds[(row["step"] - 1) // per_epoch] += train_seconds(row)
    return summary["train_seconds"] - epoch_seconds[0] + epoch_seconds[1]


def samples_to_target(paths: list[Path], name: str | None, stop_at: float) -> list[int]:
    """The samples each finished run of recipe ``name`` under ``paths`` took to reach ``stop_at``
    (``summary.json``'s samples where the run stopped at a target of that value, as ``config.yaml``
    says); one line naming the folders where none did."""
    samples = []
    for path in find_runs(paths):
        run, _ = load_run(path)
        config = read_yaml(path / run_files.CONFIG) if (path / run_files.CONFIG).is_file() else {}
        if run.status == "target_reached" and config.get("name") == name and config.get("stop_at") == stop_at:
            samples.append(int(run.summary["samples"]))
    if not samples:
        folders = ", ".join(str(path) for path in paths)
        raise ConfigError(f"bad value for '--from-runs': no run of {name} under {folders} reached stop_at={stop_at:g}")
    return samples
