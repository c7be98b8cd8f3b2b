"""``trainrun predict RUN_OR_SWEEP... --data FOLDER --out DIR``: segment every image of a folder
with finished segmentation runs (a sweep's folds ensembled, as ``trainrun ensemble`` does) and write
each case as a NIfTI label map in the input's geometry (:mod:`trainrun.tasks.whole_cases`), as
nnU-Net's ``nnUNetv2_predict`` does.

The folder is a task folder (its ``imagesTs/``, else ``imagesTr/``) or a folder of ``.nii.gz``
images (nnU-Net v2's ``CASE_0000`` channel files grouped); labels are not needed. Each case's file
is written whole or not at all, so a run killed part-way and started again segments only the cases
without a file. Where a case has a label file (``labelsTs/``, ``labelsTr/``), its Dice is computed
from the written file and printed, and all are kept in ``DIR/dice.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from rich.console import Console

from trainrun import run_files
from trainrun.atomic_io import atomic_write_json

DICE = "dice.json"


def predict_command(argv: list[str]) -> int:
    """Entry point of ``trainrun predict``."""
    from trainrun.commands.ensemble import Segmenter, trained_runs
    from trainrun.data.decathlon import check_image_cases, image_cases

    args = _parser().parse_args(argv)
    run_files.check_output_dir("--out", str(args.out))
    segmenter = Segmenter.of(trained_runs(args.runs, "predict"), args.data)
    cases = image_cases(args.data, segmenter.channels)
    check_image_cases(cases, segmenter.channels)  # every case's files, from their headers: before --out is made
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in args.out.glob(".*.nii*.tmp*"):  # a killed predict's file in writing
        stale.unlink(missing_ok=True)
    console = Console(highlight=False, width=None if Console().is_terminal else 200)
    missing = [case for case in cases if not (args.out / f"{case[0]}.nii.gz").is_file()]
    console.print(
        f"segmenting {len(missing)} of {len(cases)} case(s) of {args.data} with {len(segmenter.runs)} run(s) "
        f"on {segmenter.device.type} ({len(cases) - len(missing)} written before)"
    )
    started = time.perf_counter()
    for done, (name, images, _) in enumerate(missing, 1):
        segmenter.write(images, args.out / f"{name}.nii.gz")
        seconds = (time.perf_counter() - started) / done
        left = seconds * (len(missing) - done)
        console.print(f"{done}/{len(missing)} {name}: {seconds:.1f} s a case, {left:.0f} s left")
    scored = {name: segmenter.dice_of_file(args.out / f"{name}.nii.gz", label) for name, _, label in cases if label}
    if scored:
        means = torch.tensor(list(scored.values()), dtype=torch.float64).mean(0).tolist()
        each = ", ".join(f"{k} {value:.2%}" for k, value in enumerate(means, 1))
        console.print(f"mean Dice on {len(scored)} labelled case(s): {sum(means) / len(means):.2%} ({each})")
        atomic_write_json(args.out / DICE, {"data": str(args.data), "mean": means, "cases": scored})
    console.print(f"wrote {len(cases)} label map(s) to {args.out}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainrun predict",
        description="Segment the images of a folder with finished segmentation runs (a sweep's folds "
        "ensembled) and write NIfTI label maps in each input's geometry.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders, or a sweep folder holding them")
    parser.add_argument(
        "--data", type=Path, required=True, help="a task folder (imagesTs/ or imagesTr/) or a folder of .nii.gz"
    )
    parser.add_argument("--out", type=Path, required=True, help="the folder the label maps are written to")
    return parser
