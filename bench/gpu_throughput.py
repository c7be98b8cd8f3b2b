"""Training throughput of ResNet-50: the bare model step, the recipe's full step, and MFU.

Model step: forward, backward and optimizer step on batches already on the device (no data
loading), for every combination of resolution, batch size per device ("max" searches the
largest that fits), precision, channels-last and torch.compile asked for. Every setting starts
from empty torch.compile caches, so no setting runs eager for want of recompiles.

Full step: trainrun's Trainer with a recipe's algorithms on the same in-device uint8 batches
(``--recipe mild``), normalised on the device as a run does, as a ratio to the bare step at the
same settings. It is timed in the steady state at a fixed point of the schedule: the last tenth
of a run of ten epochs (90-100 %), where progressive resizing trains at full size; the row's
memory format is the recipe's (channels_last in the recipe for NHWC rows, not for NCHW rows).
The line says the resolution and memory format the timed steps saw.

Data rate: trainrun's FFCV loader reading ``--beton`` as a run uses it: decoded, copied to the
device and normalised into the model's memory format, second epoch, so the bottleneck is
visible next to the model rate. MFU = achieved FLOP/s (forward + backward, counted by
``torch.utils.flop_counter`` on one step) / the device's dense peak for the precision, looked
up by the exact device name (H100 SXM, PCIe and NVL differ) and printed with each row.

    .venv/bin/python bench/gpu_throughput.py                      # full matrix on a GPU
    .venv/bin/python bench/gpu_throughput.py --tiny               # seconds on a CPU (self-test)
    .venv/bin/python bench/gpu_throughput.py --resolutions 224 --batch-sizes 256 --precisions bf16 \\
        --channels-last on --compile off on --recipe mild --beton /data/ffcv/train.beton
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from trainrun.algorithms import build_algorithms
from trainrun.algorithms.specs import SPECS
from trainrun.core.distributed import select_device
from trainrun.core.engine import Callback, Engine
from trainrun.core.events import Event
from trainrun.core.precision import resolve_precision
from trainrun.core.state import State
from trainrun.core.time import Timeline
from trainrun.core.trainer import Trainer, TrainerSettings
from trainrun.data.interface import DataSpec
from trainrun.models.build import build_model
from trainrun.optim.optimizers import build_optimizer
from trainrun.schema import DataConfig, ModelConfig, OptimizerConfig
from trainrun.tasks.image_classification import ImageClassification
from trainrun.tasks.losses import binary_cross_entropy

# Dense peak TFLOP/s by the exact name torch.cuda.get_device_name reports: fp32 on the CUDA cores,
# TF32 and fp16/bf16 on the tensor cores; NVIDIA's data sheets, sparsity figures halved.
PEAK_TFLOPS = {
    "NVIDIA H100 80GB HBM3": (66.9, 494.7, 989.4),  # SXM5
    "NVIDIA H100 PCIe": (51.2, 378.0, 756.5),
    "NVIDIA H100 NVL": (60.0, 417.5, 835.5),
    "NVIDIA H200": (66.9, 494.7, 989.4),  # SXM
    "NVIDIA H200 NVL": (60.0, 417.5, 835.5),
    "NVIDIA GH200 480GB": (66.9, 494.7, 989.4),
    "NVIDIA A100-SXM4-80GB": (19.5, 156.0, 312.0),
    "NVIDIA A100-SXM4-40GB": (19.5, 156.0, 312.0),
    "NVIDIA A100 80GB PCIe": (19.5, 156.0, 312.0),
    "NVIDIA A100-PCIE-40GB": (19.5, 156.0, 312.0),
    "NVIDIA B200": (80.0, 1100.0, 2250.0),  # NVIDIA's B200 figures, dense
    "AMD Instinct MI355X": (157.3, 157.3, 2516.6),  # AMD's MI355X product brief: no TF32; dense bf16
    "NVIDIA GeForce RTX 3090": (35.6, 35.6, 71.0),  # GA102 whitepaper: fp16/bf16 with FP32 accumulate, dense
    "NVIDIA GeForce RTX 4090": (82.6, 82.6, 165.2),  # Ada whitepaper: fp16/bf16 with FP32 accumulate, dense
    "NVIDIA GeForce RTX 5090": (104.8, 104.8, 209.5),  # RTX Blackwell whitepaper: fp16/bf16 with FP32 accumulate, dense
}
SCHEDULE_EPOCHS = 10  # the full step is timed in the last of these: 90-100 % of the schedule
RECIPE_ALGORITHMS = {
    "mild": ["blurpool", "channels_last", "ema", "label_smoothing", "progressive_resizing"],
    "medium": ["blurpool", "channels_last", "ema", "label_smoothing", "progressive_resizing", "mixup", "sam"],
}


@dataclass(frozen=True)
class Setting:
    resolution: int
    batch: int
    precision: str
    channels_last: bool
    compile: bool

    def __str__(self) -> str:
        return (
            f"{self.resolution}px b{self.batch} {self.precision:<4} "
            f"{'NHWC' if self.channels_last else 'NCHW'} {'compiled' if self.compile else 'eager'}"
        )


def make_model(args: argparse.Namespace, setting: Setting, device: torch.device) -> torch.nn.Module:
    config = ModelConfig(name=args.model, num_classes=1000 if args.model != "resnet_small" else 10)
    model = build_model(config).to(device)
    if setting.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def batch(setting: Setting, classes: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.randn(setting.batch, 3, setting.resolution, setting.resolution, device=device)
    if setting.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, torch.randint(0, classes, (setting.batch,), device=device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def model_step_rate(args: argparse.Namespace, setting: Setting, device: torch.device) -> tuple[float, float]:
    """(images/s, FLOPs per step) of the bare training step."""
    torch.compiler.reset()  # each setting compiles from scratch, never past dynamo's recompile limit
    model = make_model(args, setting, device)
    optimizer = build_optimizer(model, OptimizerConfig(lr=0.1), setting.batch)
    precision, _ = resolve_precision(setting.precision, device)
    images, labels = batch(setting, model.fc.out_features, device)
    step_model = torch.compile(model) if setting.compile else model

    def step() -> None:
        with precision.autocast():
            loss = F.cross_entropy(step_model(images), labels)
        (precision.scaler.scale(loss) if precision.scaler else loss).backward()
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    with FlopCounterMode(display=False) as counter:
        with precision.autocast():
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
    optimizer.zero_grad(set_to_none=True)
    sync(device)
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync(device)
    return args.steps * setting.batch / (time.perf_counter() - started), float(counter.get_total_flops())


IMAGENET = DataConfig(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])  # the normalisation ImageNet runs use


class DeviceBatches(DataSpec):
    """The same in-device uint8 batch every step: the trainer without any loading cost.

    Resolution changes (progressive resizing) resize the batch on the device, as decoding at
    that size would deliver it.
    """

    def __init__(self, setting: Setting, classes: int, device: torch.device, steps: int) -> None:
        shape = (setting.batch, 3, setting.resolution, setting.resolution)
        self.full = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
        self.images = self.full
        self.labels = torch.randint(0, classes, (setting.batch,), device=device)
        self.batches_per_epoch = steps

    def train_batches(self, epoch: int, skip: int = 0):
        return iter([(self.images, self.labels)] * (self.batches_per_epoch - skip))

    def eval_batches(self):
        return [(self.full, self.labels)]

    def set_train_resolution(self, size: int) -> bool:
        self.images = F.interpolate(self.full.float(), size=size, mode="bilinear", antialias=True).to(torch.uint8)
        return True


@dataclass(frozen=True)
class FullStep:
    """The recipe's full step as timed: images/s and what the timed steps' inputs were."""

    rate: float
    resolution: int
    channels_last: bool

    def __str__(self) -> str:
        layout = "NHWC" if self.channels_last else "NCHW"
        return f"{self.rate:>9,.0f} img/s at 90-100% of the schedule, {self.resolution}px {layout}"


def recipe_algorithms(recipe: str, channels_last: bool) -> list[str]:
    """The recipe's methods, with channels_last only where the row is NHWC."""
    names = [name for name in RECIPE_ALGORITHMS[recipe] if name != "channels_last"]
    return [*names, "channels_last"] if channels_last else names


def full_step_rate(args: argparse.Namespace, setting: Setting, device: torch.device) -> FullStep:
    """trainrun's Trainer with the recipe's algorithms, timed after warm-up steps in the schedule's last tenth."""
    torch.compiler.reset()
    model = make_model(args, replace(setting, channels_last=False), device)  # the recipe converts NHWC rows
    classes = model.fc.out_features
    per_epoch = args.warmup + args.steps
    data = DeviceBatches(setting, classes, device, per_epoch)
    precision, _ = resolve_precision(setting.precision, device)
    timeline = Timeline(per_epoch, setting.batch, SCHEDULE_EPOCHS * per_epoch)
    state = State(
        model, None, timeline, device, precision, loss_fn=binary_cross_entropy, data=data,
        task=ImageClassification(IMAGENET), num_classes=classes,
        train_resolution=setting.resolution,
    )  # fmt: skip
    names = recipe_algorithms(args.recipe, setting.channels_last)
    algorithms = build_algorithms({name: SPECS[name].config() for name in names})

    def optimization(final_model: torch.nn.Module):
        optimizer = build_optimizer(final_model, OptimizerConfig(lr=0.1), setting.batch)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)

    settings = TrainerSettings(f"{timeline.max_batches + 1}ba", per_epoch, compile=setting.compile)
    trainer = Trainer(state, optimization, Engine(algorithms), settings)
    state.epoch = SCHEDULE_EPOCHS - 1  # start in the last epoch, as a resumed run would
    state.batch = state.epoch * per_epoch
    start, end = state.batch + args.warmup, state.batch + per_epoch
    marks: list[float] = []
    seen: set[tuple[int, bool]] = set()

    class Clock(Callback):
        def run_event(self, event, state) -> None:
            if event is Event.BATCH_END and start <= state.batch <= end:
                if state.batch in (start, end):
                    sync(device)
                    marks.append(time.perf_counter())
                if state.batch > start:
                    seen.add((state.inputs.shape[-1], state.inputs.is_contiguous(memory_format=torch.channels_last)))

    trainer.engine.callbacks.append(Clock())
    trainer.fit()
    if len(seen) != 1:
        raise RuntimeError(f"the timed steps changed their inputs {sorted(seen)}: no steady state to time")
    ((resolution, nhwc),) = seen
    return FullStep(args.steps * setting.batch / (marks[1] - marks[0]), resolution, nhwc)


def largest_batch(args: argparse.Namespace, setting: Setting, device: torch.device) -> int:
    """The largest power-of-two batch whose training step fits in device memory."""
    size, fits = 256, 0
    while size <= args.max_batch:
        try:
            model_step_rate(
                argparse.Namespace(**{**vars(args), "warmup": 1, "steps": 1}), replace(setting, batch=size), device
            )
            fits, size = size, size * 2
        except torch.OutOfMemoryError:
            break
        finally:
            torch.cuda.empty_cache()
    return fits or 128


def loader_rate(
    path: str, resolution: int, batch_size: int, workers: int, num_classes: int, device: torch.device
) -> float:
    """Images/s of trainrun's FFCV training loader as a run uses it, second epoch.

    Decode, crop and flip, the copy to ``device`` and the normalisation into channels-last
    float32 that a run's step begins with; synchronised before the clock stops.
    """
    from loaders import trainrun_data  # bench/loaders.py, beside this script

    data = trainrun_data(Path(path), resolution, batch_size, workers, num_classes, device)
    task = ImageClassification()

    def epoch(number: int) -> tuple[float, int]:
        started, images = time.perf_counter(), 0
        for batch, _labels in data.train_batches(number):
            task.normalise(batch.to(device, non_blocking=True), torch.channels_last)
            images += len(batch)
        sync(device)
        return time.perf_counter() - started, images

    epoch(0)  # compiles the pipeline
    seconds, images = epoch(1)
    return images / seconds


def peak_tflops(
    device: torch.device, precision: str, override: float | None, fp32_on_tensor_cores: bool
) -> float | None:
    """The dense peak for ``precision`` on ``device``: ``override``, else the table by exact name.

    fp32 work runs on the tensor cores (TF32) only where torch allows it: convolutions by default
    (``torch.backends.cudnn.allow_tf32``), matrix products not (``torch.get_float32_matmul_precision()``
    is ``highest`` unless a run changes it); the caller says which its work is.
    """
    if override:
        return override
    if device.type != "cuda":
        return None
    fp32, tf32, half = PEAK_TFLOPS.get(torch.cuda.get_device_name(device), (None, None, None))
    if precision != "fp32":
        return half
    return tf32 if fp32_on_tensor_cores else fp32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--resolutions", type=int, nargs="+", default=[176, 224])
    parser.add_argument("--batch-sizes", nargs="+", default=["256", "max"])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "amp", "bf16"])
    parser.add_argument("--channels-last", nargs="+", default=["off", "on"], choices=["off", "on"])
    parser.add_argument("--compile", nargs="+", default=["off", "on"], choices=["off", "on"])
    parser.add_argument("--recipe", choices=sorted(RECIPE_ALGORITHMS), help="also time the recipe's full step")
    parser.add_argument("--beton", help="also time FFCV's loader reading this .beton")
    parser.add_argument("--beton-classes", type=int, default=1000, help="the .beton's number of classes")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-batch", type=int, default=1024)
    parser.add_argument("--peak-tflops", type=float, help="the device's peak, if not in the built-in table")
    parser.add_argument("--tiny", action="store_true", help="a few seconds on a CPU: checks the script runs")
    args = parser.parse_args()
    if args.tiny:
        args.model, args.resolutions, args.batch_sizes = "resnet_small", [16], ["8"]
        args.precisions, args.compile, args.warmup, args.steps = ["fp32", "bf16"], ["off"], 1, 2
        args.recipe = args.recipe or "mild"
    device = select_device("auto", local_rank=0)  # as a run: cuDNN autotuning on a GPU
    for precision in args.precisions:  # before any kernel runs: a CPU may need its oneDNN ISA limited
        resolve_precision(precision, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}, {args.model}, {args.steps} timed steps after {args.warmup}")
    if device.type == "cuda" and not args.peak_tflops and name not in PEAK_TFLOPS:
        print(f"no peak known for '{name}': pass --peak-tflops for MFU")
    if args.beton:
        for resolution in args.resolutions:
            rate = loader_rate(args.beton, resolution, 256, args.workers, args.beton_classes, device)
            print(
                f"FFCV loader to {device.type}, normalised, {resolution}px, {args.workers} workers: {rate:,.0f} img/s"
            )
    grid = itertools.product(args.resolutions, args.batch_sizes, args.precisions, args.channels_last, args.compile)
    for resolution, size, precision, nhwc, compiled in grid:
        setting = Setting(resolution, 0 if size == "max" else int(size), precision, nhwc == "on", compiled == "on")
        if size == "max":
            setting = replace(setting, batch=largest_batch(args, setting, device))
        rate, flops = model_step_rate(args, setting, device)
        line = f"{setting!s:<40} model step {rate:>9,.0f} img/s"
        peak = peak_tflops(device, precision, args.peak_tflops, torch.backends.cudnn.allow_tf32)
        if peak:
            line += f"  MFU {rate / setting.batch * flops / (peak * 1e12):6.1%} of {peak:g} TFLOP/s"
        if args.recipe:
            full = full_step_rate(args, setting, device)
            line += f"  {args.recipe} full step {full} ({full.rate / rate:.2f} of the model step)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
