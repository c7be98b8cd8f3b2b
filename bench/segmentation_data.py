"""Full-size segmentation data: N Task01-shaped cases written as NIfTI, then what preparing, cropping
and evaluating them costs.

1. ``--cases`` cases of the Decathlon brain-tumour task's shape (240 x 240 x 155, 4 channels,
   float32, 1 mm; labels 0-3), from trainrun's synthetic BraTS generator at that size, written as
   ``.nii.gz`` with a ``dataset.json`` into ``OUT/Task01_like`` (kept between runs; ``--shape``
   gives another size).
2. Preparation into a fresh store for each of ``--workers`` (``data.num_workers``), each in a child
   process: seconds in all and a case, peak resident memory (the largest of the process and its
   workers), store bytes a case.
3. Training crops of ``--patch`` (128^3, nnU-Net's) with trainrun's augmentation in one process:
   crops per second per loader worker, against one GPU's step: NVIDIA's nnU-Net trains 3D Task01 at
   27.48 volumes (crops) per second on one A100 at batch 2 (DeepLearningExamples nnUNet README).
4. One case's evaluation by 3D sliding windows (``model=unet3d``, nnU-Net's 32-320 filters) for each
   of ``--eval-patches`` and ``--window-batches``, each in a child process: seconds and peak resident
   memory of the process (the model, the volume, its blended logits and each pass's windows).

5. ``trainrun predict``'s steps on ``--predict-cases`` of the cases with ``model=unet2d`` at
   ``--predict-patch`` (Composer's 192 x 160; untrained weights: the time is the geometry's and the
   windows', not the quality's): seconds a case reading and preparing it, in the model's windows,
   bringing the probabilities back to its grid (resampling, post-processing, classes, un-cropping)
   and writing its label map, and the peak resident memory.

    .venv/bin/python bench/segmentation_data.py OUT [--cases 12] [--workers 0 2] [--patch 128 128 128]
        [--eval-patches 64 128] [--window-batches 1 4] [--predict-cases 2] [--predict-patch 192 160]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SHAPE = [155, 240, 240]  # (D, H, W): the Decathlon's z, y, x
A100_CROPS_PER_SECOND = 27.48  # nnU-Net 3D, one A100, batch 2, AMP (DeepLearningExamples README)


def write_cases(root: Path, cases: int, shape: tuple[int, int, int]) -> None:
    """``cases`` Task01-shaped NIfTI cases and their dataset.json in ``root`` (those present kept)."""
    import nibabel

    from trainrun.data.segmentation import SYNTHETIC_LABELS, SYNTHETIC_MODALITIES, synthetic_case

    (root / "imagesTr").mkdir(parents=True, exist_ok=True)
    (root / "labelsTr").mkdir(exist_ok=True)
    names = [f"BRATS_{index:03d}" for index in range(cases)]
    for index, name in enumerate(names):
        image_file, label_file = (root / folder / f"{name}.nii.gz" for folder in ("imagesTr", "labelsTr"))
        if label_file.is_file():
            continue
        started = time.perf_counter()
        image, label = synthetic_case(index, shape)  # (C, D, H, W) -> NIfTI's (x, y, z, channel)
        nibabel.save(nibabel.Nifti1Image(image.transpose(3, 2, 1, 0), np.eye(4)), image_file)
        nibabel.save(nibabel.Nifti1Image(label.transpose(2, 1, 0), np.eye(4)), label_file)
        print(f"wrote {name} ({time.perf_counter() - started:.1f} s)", flush=True)
    manifest = {
        "name": "Task01_like",
        "modality": dict(enumerate(SYNTHETIC_MODALITIES)),
        "labels": dict(enumerate(SYNTHETIC_LABELS)),
        "training": [{"image": f"./imagesTr/{n}.nii.gz", "label": f"./labelsTr/{n}.nii.gz"} for n in names],
    }
    (root / "dataset.json").write_text(json.dumps(manifest, indent=1))


def child(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; what it prints last (JSON) and its peak memory in GB."""
    wrapper = f"{code}\nimport resource, json\nresult['peak_gb'] = max(resource.getrusage(w).ru_maxrss for w in "
    wrapper += "(resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 2**20\nprint(json.dumps(result))"
    done = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"a measurement failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def preparation(source: Path, out: Path, workers: int, cases: int) -> None:
    store = out / f"store-w{workers}"
    subprocess.run(["rm", "-rf", str(store)], check=True)
    code = (
        "import time\nfrom pathlib import Path\nfrom trainrun.data.decathlon import write_decathlon\n"
        f"started = time.perf_counter()\nwrite_decathlon(Path({str(source)!r}), Path({str(store)!r}), {workers})\n"
        "result = {'seconds': time.perf_counter() - started}"
    )
    result = child(code)
    size = sum(file.stat().st_size for file in store.iterdir())
    print(
        f"| {workers} | {result['seconds']:.1f} | {result['seconds'] / cases:.2f} | {result['peak_gb']:.2f} "
        f"| {size / cases / 1e6:.1f} |",
        flush=True,
    )


def crops(store: Path, patch: list[int], count: int) -> float:
    """Augmented training crops per second in this process (one loader worker's rate)."""
    import torch

    from trainrun.data.segmentation import Patches
    from trainrun.data.volume_store import VolumeStore
    from trainrun.schema import SegmentationDataConfig

    torch.set_num_threads(1)  # as in a loader worker
    volumes = VolumeStore.open(store)
    patches = Patches(volumes, list(range(len(volumes.cases))), SegmentationDataConfig(patch_size=patch), True)
    patches[0]  # the first case's memory map opened
    started = time.perf_counter()
    for index in range(count):
        torch.manual_seed(index)
        patches[index]
    return count / (time.perf_counter() - started)


def evaluation(store: Path, patch: int, window_batch: int) -> None:
    code = f"""
import time, torch
from trainrun.config import compose
from trainrun.data.volume_store import VolumeStore
from trainrun.models.unet import build
from trainrun.tasks.segmentation import Segmentation
from trainrun.validation import validate
overrides = ["task=segmentation", "data=synthetic_brats", "model=unet3d"]
overrides += ["data.segmentation.patch_size=[{patch},{patch},{patch}]", "data.segmentation.window_batch={window_batch}"]
config = validate(compose(overrides), files=False)
model = build(config.model).eval()
store = VolumeStore.open(__import__("pathlib").Path({str(store)!r}))
volume = torch.from_numpy(store.image(0).astype("float32"))
started = time.perf_counter()
with torch.inference_mode():
    (logits,) = Segmentation(config.data).predict(model, [volume])
result = {{"seconds": time.perf_counter() - started, "shape": list(volume.shape)}}
"""
    result = child(code)
    print(f"| {patch}^3 | {window_batch} | {result['shape']} | {result['seconds']:.0f} | {result['peak_gb']:.2f} |")


def prediction(source: Path, predicted: Path, cases: int, patch: list[int]) -> None:
    predicted.mkdir(parents=True, exist_ok=True)
    code = f"""
import time, torch
from pathlib import Path
from trainrun.config import compose
from trainrun.data.decathlon import image_cases, read_manifest
from trainrun.models.unet import build
from trainrun.tasks.segmentation import Segmentation
from trainrun.tasks.whole_cases import Preparation, class_map, model_logits, prepared, write_label_map
from trainrun.validation import validate
overrides = ["task=segmentation", "data=synthetic_brats", "model=unet2d", "data.segmentation.patch_size={patch}"]
config = validate(compose(overrides), files=False)
model, task = build(config.model).eval(), Segmentation(config.data)
preparation = Preparation.of(None, read_manifest(Path({str(source)!r}))[1], config.model.num_classes)
steps = dict.fromkeys(("prepare", "model", "back", "write"), 0.0)
for name, images, _ in image_cases(Path({str(source)!r}), 4)[:{cases}]:
    started = time.perf_counter()
    case = prepared(images, preparation)
    marks = [time.perf_counter()]
    with torch.inference_mode():
        logits = model_logits(task, model, case, torch.device("cpu"))
    marks.append(time.perf_counter())
    classes = class_map(task, logits, case)
    marks.append(time.perf_counter())
    write_label_map(Path({str(predicted)!r}) / f"{{name}}.nii.gz", classes, preparation.values, images[0])
    marks.append(time.perf_counter())
    for step, begun, ended in zip(steps, [started, *marks], marks):
        steps[step] += (ended - begun) / {cases}
result = {{**steps, "box": list(case.cropped)}}
"""
    result = child(code)
    seconds = [result[step] for step in ("prepare", "model", "back", "write")]
    each = " | ".join(f"{value:.1f}" for value in seconds)
    print(f"| {patch} | {result['box']} | {each} | {sum(seconds):.1f} | {result['peak_gb']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--cases", type=int, default=12)
    parser.add_argument("--shape", type=int, nargs=3, default=SHAPE, help="(D, H, W): Task01's by default")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--patch", type=int, nargs=3, default=[128, 128, 128])
    parser.add_argument("--crops", type=int, default=40)
    parser.add_argument("--eval-patches", type=int, nargs="*", default=[64, 128])
    parser.add_argument("--window-batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--predict-cases", type=int, default=2)
    parser.add_argument("--predict-patch", type=int, nargs=2, default=[192, 160])
    args = parser.parse_args()
    source = args.out / "Task01_like"
    write_cases(source, args.cases, tuple(args.shape))
    depth, height, width = args.shape
    print(f"\npreparing {args.cases} cases of {height} x {width} x {depth} x 4 (.nii.gz)")
    print("| data.num_workers | seconds | seconds a case | peak memory GB | store MB a case |")
    print("|---|---|---|---|---|")
    for workers in args.workers:
        preparation(source, args.out, workers, args.cases)
    store = args.out / f"store-w{args.workers[0]}"
    rate = crops(store, args.patch, args.crops)
    print(f"\ntraining crops of {args.patch}, augmented: {rate:.1f} a second in one process; one A100's nnU-Net step")
    print(f"takes {A100_CROPS_PER_SECOND} a second: {A100_CROPS_PER_SECOND / rate:.1f} loader workers of this CPU")
    if args.eval_patches:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"\none case's evaluation (model=unet3d, one case; this process peaked at {peak:.2f} GB)")
        print("| patch | window_batch | volume (C, D, H, W) | seconds | peak memory GB |")
        print("|---|---|---|---|---|")
        for patch in args.eval_patches:
            for window_batch in args.window_batches:
                evaluation(store, patch, window_batch)
    if args.predict_cases:
        print(f"\ntrainrun predict's steps, seconds a case ({args.predict_cases} cases, model=unet2d, untrained)")
        print("| patch | box (D, H, W) | read and prepare | model | back to the case's grid | write | all | peak GB |")
        print("|---|---|---|---|---|---|---|---|")
        prediction(source, args.out / "predicted", args.predict_cases, args.predict_patch)


if __name__ == "__main__":
    main()
