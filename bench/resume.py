"""Time to the first step after a mid-epoch resume on FFCV: start the epoch's order at the resume
point (trainrun) against decoding and dropping the batches before it (FFCV cannot seek; trainrun
did that before).

Both are timed in the same process on the same ``.beton`` (JPEG, as ImageNet's), after a first
epoch has compiled FFCV's pipelines; rounds alternate and the best of each is kept. The resume
point is ``--at`` of the epoch (0.5: the middle).

    .venv/bin/python bench/resume.py [--images 6000] [--side 160] [--batch 64] [--at 0.5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from trainrun.data.builtin import SyntheticImages
from trainrun.data.ffcv import FFCVData
from trainrun.data.write import WriteSettings, write_beton
from trainrun.schema import DataConfig


def first_batch_seconds(data: FFCVData, skip: int, drop: int) -> float:
    """Seconds from asking for the epoch at batch ``skip`` (after decoding ``drop`` to throw away)
    to holding the first batch trained on."""
    start = time.perf_counter()
    batches = data.train_batches(1, skip=skip)
    for _ in range(drop):
        next(batches)
    next(batches)
    elapsed = time.perf_counter() - start
    for _ in batches:  # finish the epoch: FFCV's workers must not outlive their iterator mid-read
        pass
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--side", type=int, default=160)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--at", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "train.beton"
        images = SyntheticImages(args.images, args.side, num_classes=10, seed=0)
        write_beton(images, path, WriteSettings(mode="jpg", max_resolution=args.side, num_workers=args.workers))
        config = DataConfig(
            name="beton", loader="ffcv", train=str(path), val=str(path), num_classes=10, resolution=args.side
        )
        config.num_workers = args.workers
        data = FFCVData(config, args.batch, args.batch, seed=0, device=torch.device("cpu"))
        for _ in data.train_batches(0):  # compile FFCV's pipelines once
            pass
        at = int(data.batches_per_epoch * args.at)
        best = {"decode and drop": float("inf"), "start at the resume point": float("inf")}
        for _ in range(args.rounds):
            best["decode and drop"] = min(best["decode and drop"], first_batch_seconds(data, 0, at))
            best["start at the resume point"] = min(best["start at the resume point"], first_batch_seconds(data, at, 0))
    print(
        f"{args.images} JPEG images of {args.side} px, batch {args.batch}, resume at batch {at} of "
        f"{data.batches_per_epoch}, {args.workers} workers, best of {args.rounds}"
    )
    for name, seconds in best.items():
        print(f"  {name:<26} {seconds:8.3f} s to the first batch")
    print(f"  ratio: {best['decode and drop'] / best['start at the resume point']:.1f}x sooner")


if __name__ == "__main__":
    main()
