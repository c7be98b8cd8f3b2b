"""``trainrun ensemble RUN... --data FOLDER``: several runs of one segmentation task (the folds of a
cross-validation, ``trainrun sweep folds=all``) predict the cases of a held-out Decathlon folder
together, as nnU-Net ensembles its five folds: each volume's class probabilities (softmax; sigmoid
per region) are averaged over the runs, then scored as one prediction (arg-max, or above one half),
after the first run's post-processing. Each run alone is scored on the same cases beside it. The
mean Dice of each and of the ensemble is printed and written, per case and per class, to
``ensemble.json`` (beside the first folder given, or ``--out``). The held-out cases are prepared
with the runs' training store's voxel spacing and CT statistics (:func:`training_reference`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from trainrun import run_files
from trainrun.atomic_io import atomic_write_json, read_yaml
from trainrun.errors import ConfigError, DataError
from trainrun.kinds import Capability, task_spec, tasks_offering
from trainrun.schema import DataConfig, TrainConfig

if TYPE_CHECKING:
    from trainrun.tasks.segmentation import Segmentation

ENSEMBLE = "ensemble.json"


def ensemble_command(argv: list[str]) -> int:
    """Entry point of ``trainrun ensemble``."""
    args = _parser().parse_args(argv)
    out = args.out or (args.runs[0] / ENSEMBLE)
    run_files.check_output_file("--out", out)  # before any prediction
    runs = trained_runs(args.runs)
    configs = [run_config(run) for run in runs]
    data = dataclasses.replace(configs[0].data, name="decathlon", path=str(args.data))
    from trainrun.validation import validate

    try:  # the held-out folder, checked as the runs' data was
        validate(OmegaConf.structured(dataclasses.replace(configs[0], data=data)))
    except ConfigError as error:
        raise ConfigError(f"bad value for '--data': the runs' models do not fit '{args.data}': {error}") from None
    scores = predict(runs, configs, data)
    names = [run.name for run in runs]
    means = {name: _mean(values) for name, values in scores.items()}
    table = Table(title=f"mean Dice on {len(scores['ensemble'])} held-out cases of {args.data}")
    for column in ("predicted by", "mean Dice", *(f"Dice {k}" for k in range(1, len(means["ensemble"])))):
        table.add_column(column)
    for name in [*names, "ensemble"]:
        table.add_row(name, *(f"{value:.2%}" for value in means[name]))
    console = Console(width=None if Console().is_terminal else 200)
    console.print(table)
    atomic_write_json(out, {"data": str(args.data), "runs": [str(run) for run in runs], "mean": means, "cases": scores})
    console.print(f"wrote {out}", highlight=False)
    return 0


def training_reference(data: DataConfig) -> dict | None:
    """The runs' training store's index (its voxel spacing and CT statistics), which the held-out
    cases are prepared with, as the model saw its training cases; None where the runs trained on a
    built-in set, or where their task folder is not here (then said: the held-out folder's own)."""
    from trainrun.data.segmentation import store_path

    if data.path is None:  # a built-in set
        return None
    try:
        return json.loads((store_path(data) / "index.json").read_text())
    except DataError as error:
        print(f"note: the runs' training data is not readable here ({error}): the held-out cases are "
              "resampled and normalised by their own statistics", flush=True)  # fmt: skip
        return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainrun ensemble",
        description="Average the predictions of segmentation runs (a cross-validation's folds) on held-out cases.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders, or a sweep folder holding them")
    parser.add_argument("--data", type=Path, required=True, help="a Decathlon task folder of held-out cases")
    parser.add_argument("--out", type=Path, help=f"where to write the scores (default: RUNS[0]/{ENSEMBLE})")
    return parser


def trained_runs(folders: list[Path]) -> list[Path]:
    """The runs under ``folders`` that wrote their final weights, or one line saying there are none."""
    from trainrun.report.runs import find_runs

    runs = [run for run in find_runs(folders) if (run / run_files.MODEL).is_file()]
    if not runs:
        shown = ", ".join(str(folder) for folder in folders)
        raise ConfigError(f"bad value for 'RUNS': no finished segmentation run with {run_files.MODEL} in {shown}")
    return runs


def run_config(run: Path) -> TrainConfig:
    """Segmentation run ``run``'s validated config, or one line saying why it is not one."""
    from trainrun.validation import validate

    config = validate(OmegaConf.create(read_yaml(run / run_files.CONFIG)), files=False)
    if Capability.FOLDS not in task_spec(config.task.name).offers:
        tasks = " or ".join(tasks_offering({Capability.FOLDS}))
        raise ConfigError(f"bad value for 'RUNS': '{run}' trained task {config.task.name}; ensemble needs {tasks}")
    return config


def predict(runs: list[Path], configs: list[TrainConfig], data) -> dict[str, list[list[float]]]:
    """Per case, the Dice of each class (region) as each run and the ensemble predict it."""
    from trainrun.core.distributed import select_device
    from trainrun.data.segmentation import Volumes, store_path
    from trainrun.data.volume_store import VolumeStore
    from trainrun.run import model_holding
    from trainrun.tasks.segmentation import Segmentation

    task = Segmentation(data)
    outputs = {(config.model.num_classes, config.model.unet.dimensions) for config in configs}
    if len(outputs) > 1:
        raise ConfigError(f"bad value for 'RUNS': the runs differ in outputs and dimensions {sorted(outputs)}")
    device = select_device("auto", 0)
    models = [
        model_holding(config, None, torch.load(run / run_files.MODEL, map_location="cpu", weights_only=True))
        .to(device)
        .eval()
        for run, config in zip(runs, configs, strict=True)
    ]
    store = VolumeStore.open(store_path(data, reference=training_reference(configs[0].data)))
    scores: dict[str, list[list[float]]] = {run.name: [] for run in runs} | {"ensemble": []}

    def scored(run: Path, model: torch.nn.Module, volume: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """``model``'s logits for ``volume``, its Dice kept as ``run``'s."""
        (logits,) = task.predict(model, [volume])
        scores[run.name].append(task.volume_dice(logits, label).tolist())
        return logits

    with torch.inference_mode():
        for volume, label in Volumes(store, list(range(len(store.cases)))):  # as evaluation reads them
            volume, label = volume.to(device), label.to(device)
            each = (scored(run, model, volume, label) for run, model in zip(runs, models, strict=True))
            scores["ensemble"].append(task.volume_dice(ensemble_scores(task, each), label).tolist())
    return scores


def ensemble_scores(task: Segmentation, logits: Iterator[torch.Tensor]) -> torch.Tensor:
    """The ensemble of one case's predictions (each run's logits, read one at a time): the mean of
    their probabilities (nnU-Net's rule), as the scores Dice and post-processing read."""
    total, count = None, 0
    for each in logits:
        probabilities = task.probabilities(each)
        total, count = (probabilities if total is None else total.add_(probabilities)), count + 1
    return task.scores(total / count)


def _mean(cases: list[list[float]]) -> list[float]:
    """(mean Dice, then each class's mean) over the cases."""
    each = torch.tensor(cases, dtype=torch.float64).mean(0)
    return [float(each.mean()), *each.tolist()]
