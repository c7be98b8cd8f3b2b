"""``trainrun ensemble RUN... --data FOLDER``: several runs of one segmentation task (the folds of a
cross-validation, ``trainrun sweep folds=all``) predict the labelled cases of a held-out Decathlon
folder together, as nnU-Net's predictor ensembles the folds it is given: each case's logits are
averaged over the runs, then made classes in the case's own geometry
(:mod:`trainrun.tasks.whole_cases`, what ``trainrun predict`` writes) and scored against its label
file. Each run alone is scored on the same cases beside it. The mean Dice of each and of the
ensemble is printed and written, per case and per class, to ``ensemble.json`` (beside the first
folder given, or ``--out``). Cases are prepared with the runs' training store's voxel spacing and CT
statistics (:func:`training_reference`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
from trainrun.tasks.whole_cases import (
    Preparation,
    PreparedCase,
    class_map,
    map_dice,
    model_logits,
    prepared,
    true_classes,
    write_label_map,
)

if TYPE_CHECKING:
    from trainrun.tasks.segmentation import Segmentation

ENSEMBLE = "ensemble.json"


def ensemble_command(argv: list[str]) -> int:
    """Entry point of ``trainrun ensemble``."""
    args = _parser().parse_args(argv)
    out = args.out or (args.runs[0] / ENSEMBLE)
    run_files.check_output_file("--out", out)  # before any prediction
    trained = trained_runs(args.runs)
    runs, configs = list(trained), list(trained.values())
    data = dataclasses.replace(configs[0].data, name="decathlon", path=str(args.data))
    from trainrun.validation import validate

    try:  # the held-out folder, checked as the runs' data was
        validate(OmegaConf.structured(dataclasses.replace(configs[0], data=data)))
    except ConfigError as error:
        raise ConfigError(f"bad value for '--data': the runs' models do not fit '{args.data}': {error}") from None
    from trainrun.data.decathlon import check_image_cases, decathlon_listing

    segmenter, cases = Segmenter.of(trained, args.data), decathlon_listing(args.data)[1]
    check_image_cases(cases, segmenter.channels)  # every case's files, from their headers: before any prediction
    scores = predict(segmenter, cases)
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


def trained_runs(folders: list[Path], command: str = "ensemble") -> dict[Path, TrainConfig]:
    """Every run at or under ``folders`` with its validated config, each a finished segmentation run
    (its final weights written) of one task: one line naming the first that is not (a run left out
    silently would change the ensemble)."""
    from trainrun.report.runs import find_runs

    runs, tasks = {run: run_config(run, command) for run in find_runs(folders)}, {}
    for run, config in runs.items():
        if not (run / run_files.MODEL).is_file():
            raise ConfigError(
                f"bad value for 'RUNS': '{run}' has no {run_files.MODEL} "
                "(a segmentation run writes it when it finishes)"
            )
        data = config.data
        where = f" '{Path(data.path).expanduser().resolve()}'" if data.path else ""
        tasks.setdefault(f"data={data.name}{where} ({data.num_classes} classes)", run)
        if len(tasks) > 1:
            (first, first_run), (other, _) = tasks.items()
            raise ConfigError(
                f"bad value for 'RUNS': '{run}' trained on {other}, '{first_run}' on {first}: the runs segment one task"
            )
    return runs


def run_config(run: Path, command: str = "ensemble") -> TrainConfig:
    """Segmentation run ``run``'s validated config, or one line saying why it is not one."""
    from trainrun.validation import validate

    config = validate(OmegaConf.create(read_yaml(run / run_files.CONFIG)), files=False)
    if Capability.FOLDS not in task_spec(config.task.name).offers:
        tasks = " or ".join(tasks_offering({Capability.FOLDS}))
        raise ConfigError(f"bad value for 'RUNS': '{run}' trained task {config.task.name}; {command} needs {tasks}")
    return config


@dataclass
class Segmenter:
    """Finished segmentation runs' models, and how their cases are prepared and brought back."""

    runs: list[Path]
    models: list[torch.nn.Module]
    task: Segmentation
    preparation: Preparation
    channels: int
    device: torch.device

    @classmethod
    def of(cls, trained: dict[Path, TrainConfig], folder: Path) -> Segmenter:
        """The models of the ``trained`` runs (:func:`trained_runs`; one task, outputs and
        dimensions), on the best device here, to segment the cases of ``folder`` (whose
        ``dataset.json``, where there is one, names the label values and schemes when the runs'
        training store is not here)."""
        from trainrun.core.distributed import select_device
        from trainrun.data.decathlon import read_manifest
        from trainrun.run import model_holding
        from trainrun.tasks.segmentation import Segmentation

        runs, configs = list(trained), list(trained.values())
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
        described = read_manifest(folder)[1] if (folder / "dataset.json").is_file() else None
        first = configs[0]
        preparation = Preparation.of(training_reference(first.data), described, first.model.num_classes)
        return cls(runs, models, Segmentation(first.data), preparation, first.model.unet.in_channels, device)

    def prepared(self, images: tuple[Path, ...]) -> PreparedCase:
        return prepared(images, self.preparation)

    @torch.inference_mode()
    def each_run(self, case: PreparedCase) -> Iterator[torch.Tensor]:
        """Each run's class (region) logits of ``case``, one at a time."""
        for model in self.models:
            yield model_logits(self.task, model, case, self.device)

    def ensembled(self, case: PreparedCase, seen: Callable[[Path, torch.Tensor], None] | None = None) -> torch.Tensor:
        """The ensemble's class (region) logits of ``case``: the mean of the runs' logits (nnU-Net's
        predictor's rule for several folds), each run's read, shown to ``seen`` with its run folder,
        and added in turn, so that one case's logits of two runs are held at a time. The one rule
        ``predict`` writes and ``ensemble`` scores."""
        total = None
        for run, logits in zip(self.runs, self.each_run(case), strict=True):
            if seen is not None:
                seen(run, logits)
            total = logits.clone() if total is None else total.add_(logits)
        return total / len(self.runs)

    def write(self, images: tuple[Path, ...], path: Path) -> None:
        """The ensemble's label map of the case of ``images``, written to ``path`` in its geometry."""
        case = self.prepared(images)
        classes = class_map(self.task, self.ensembled(case), case)
        write_label_map(path, classes, self.preparation.values, images[0])

    def dice_of_file(self, written: Path, label: Path) -> list[float]:
        """The Dice of a written label map against the case's label file."""
        values = self.preparation.values
        return map_dice(self.task, true_classes(written, values), true_classes(label, values))


def predict(segmenter: Segmenter, cases: list) -> dict[str, list[list[float]]]:
    """Per case, the Dice of each class (region) as each run and the ensemble predict it, in the
    case's geometry."""
    scores: dict[str, list[list[float]]] = {run.name: [] for run in segmenter.runs} | {"ensemble": []}
    task, values = segmenter.task, segmenter.preparation.values
    for _, images, label in cases:
        case, truth = segmenter.prepared(images), true_classes(label, values)

        def score(run: Path, logits: torch.Tensor, case: PreparedCase = case, truth=truth) -> None:  # noqa: ANN001
            scores[run.name].append(map_dice(task, class_map(task, logits, case), truth))

        scores["ensemble"].append(map_dice(task, class_map(task, segmenter.ensembled(case, score), case), truth))
    return scores


def _mean(cases: list[list[float]]) -> list[float]:
    """(mean Dice, then each class's mean) over the cases."""
    each = torch.tensor(cases, dtype=torch.float64).mean(0)
    return [float(each.mean()), *each.tolist()]
