"""The estimate's operation model against a GPU: each kind of operation ``trainrun estimate`` times
(matrix products, convolutions: dense, depthwise and grouped, fused attention, element-wise traffic,
the floor an operation costs) at the shapes the brought models run, and whole training steps of
models trainrun has never measured on a GPU (timm's ConvNeXt-T, ViT-B/16, EfficientNet-B0 and
RegNetY-1.6GF, transformers' Qwen3 at two shapes), each beside the time the estimate gives it on the
GPU's hardware group. A depthwise and a grouped convolution are timed forward alone and forward and
backward: the validation's timm steps with them ran slower than estimated in their backward
(bench/forward_backward.py).

The estimate's time of an operation is :class:`~trainrun.estimate.device.Device`'s for the aten
operations the same call records on fake tensors (:class:`~trainrun.estimate.operations.OperationLog`,
attention as its fused kernel); a step's is ``trainrun estimate``'s for the run's config. A run's step
is ``trainrun`` itself, ``--steps`` steps on one device, the rate of the second half (``metrics.jsonl``).

    .venv/bin/python bench/operations.py --predict --hardware 8xh200   # this CPU, before the GPU call
    python bench/operations.py                                         # on the GPU: both columns
    .venv/bin/python bench/operations.py --cpu                         # tiny, on this CPU: the harness
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from fast_paths import trained

from trainrun.config import compose
from trainrun.estimate import estimate
from trainrun.estimate.device import Device, device_of
from trainrun.estimate.operations import AsFusedAttention, OperationLog
from trainrun.validation import validate

GROUPS = {"H200": "8xh200", "H100": "8xh100_aws", "A100": "8xa100_80gb"}  # a GPU's name: its hardware group


@dataclass(frozen=True)
class Case:
    """One operation at one shape: what it builds (on a device, at a dtype) and runs."""

    name: str
    kind: str
    build: Callable[[torch.device, torch.dtype], tuple]
    run: Callable[..., object]


def matmul(m: int, n: int, k: int) -> Case:
    """A matrix product's forward, (m, k) by (k, n)."""
    return Case(
        f"{m} x {n} x {k}",
        "matmul",
        lambda device, dtype: (
            torch.randn(m, k, device=device, dtype=dtype),
            torch.randn(k, n, device=device, dtype=dtype),
        ),
        torch.mm,
    )


def convolution(
    batch: int,
    channels: int,
    out: int,
    side: int,
    kernel: int,
    groups: int = 1,
    *,
    backward: bool = True,
    last: bool = True,
) -> Case:
    """A convolution's forward and backward (both gradients), channels-last (channels-first where not
    ``last``), as a training step runs it; its forward alone where not ``backward``."""
    layout = torch.channels_last if last else torch.contiguous_format

    def build(device: torch.device, dtype: torch.dtype) -> tuple:
        x = torch.randn(batch, channels, side, side, device=device, dtype=dtype).to(memory_format=layout)
        weight = torch.randn(out, channels // groups, kernel, kernel, device=device, dtype=dtype)
        return x.requires_grad_(), weight.to(memory_format=layout).requires_grad_()

    def run(x: torch.Tensor, weight: torch.Tensor) -> None:
        if not backward:
            with torch.no_grad():
                F.conv2d(x, weight, padding=kernel // 2, groups=groups)
            return
        F.conv2d(x, weight, padding=kernel // 2, groups=groups).sum().backward()

    kind = "depthwise" if groups == channels else "grouped" if groups > 1 else "convolution"
    layout_words = "" if last else ", channels-first"
    shape = f"{batch} x {channels}->{out} x {side}^2, {kernel}x{kernel}, groups {groups}{layout_words}"
    return Case(shape if backward else f"{shape}, forward", kind, build, run)


def attention(batch: int, heads: int, tokens: int, width: int, causal: bool) -> Case:
    """Fused attention's forward and backward."""

    def build(device: torch.device, dtype: torch.dtype) -> tuple:
        return tuple(
            torch.randn(batch, heads, tokens, width, device=device, dtype=dtype, requires_grad=True) for _ in range(3)
        )

    def run(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        F.scaled_dot_product_attention(query, key, value, is_causal=causal).sum().backward()

    return Case(f"{batch} x {heads} x {tokens} x {width}{', causal' if causal else ''}", "attention", build, run)


def elementwise(elements: int) -> Case:
    """An addition of two tensors: a memory-bound operation, or at one element the floor an operation costs."""
    return Case(
        f"add of 2 x {elements:,}",
        "memory",
        lambda device, dtype: tuple(torch.randn(elements, device=device, dtype=dtype) for _ in range(2)),
        torch.add,
    )


OPERATIONS = [
    matmul(16384, 4096, 4096),  # Llama 8B's attention projections, 2 x 8,192 tokens
    matmul(16384, 14336, 4096),  # its feed-forward
    matmul(37824, 3072, 768),  # ViT-B/16's MLP at batch 192 (197 tokens)
    matmul(8192, 768, 768),  # GPT-2 125M's projection, 8 x 1,024 tokens
    matmul(100352, 64, 64),  # a narrow product
    convolution(256, 64, 64, 56, 3),  # ResNet-50's first stage
    convolution(256, 64, 64, 56, 3, last=False),  # the same channels-first: cuDNN's transposes
    convolution(256, 256, 64, 56, 1),
    convolution(256, 512, 512, 7, 3),  # its last stage
    convolution(256, 96, 96, 56, 7, groups=96),  # ConvNeXt-T's depthwise 7 x 7
    convolution(512, 120, 120, 28, 3, groups=5),  # RegNetY-1.6GF's grouped 3 x 3 (24 channels a group)
    convolution(512, 120, 120, 28, 3, groups=5, backward=False),
    convolution(512, 120, 120, 28, 3, groups=5, backward=False, last=False),  # channels-first: its products' time
    convolution(512, 128, 128, 28, 3, groups=8, backward=False),  # 16 channels a group (RegNetY-800MF's): tiled
    convolution(512, 48, 48, 56, 3, groups=2),  # its first stage's: 2 groups
    convolution(512, 144, 144, 56, 3, groups=144),  # EfficientNet-B0's depthwise 3 x 3 (its second stage)
    convolution(512, 144, 144, 56, 3, groups=144, backward=False),
    convolution(512, 240, 240, 28, 5, groups=240),  # its 5 x 5 (third stage)
    attention(2, 32, 8192, 128, causal=True),  # Llama 8B
    attention(192, 12, 197, 64, causal=False),  # ViT-B/16
    elementwise(1 << 28),
    elementwise(1),  # the floor an operation costs
]
CPU_OPERATIONS = [
    matmul(256, 128, 64),
    convolution(4, 16, 16, 16, 3),
    convolution(4, 16, 16, 16, 7, groups=16),
    convolution(4, 24, 24, 16, 3, groups=3),
    convolution(4, 24, 24, 16, 3, groups=3, backward=False),
    attention(2, 4, 64, 16, causal=True),
    elementwise(1 << 16),
    elementwise(1),
]

TIMM = [
    "model=timm",
    "data=synthetic",
    "data.resolution=224",
    "data.eval_resolution=224",
    "precision=amp",
    "optimizer=sgd",
]
QWEN3_06B = [  # Qwen3-0.6B's shape (its config.json), on the built-in corpus
    "task=causal_lm",
    "data=stdlib_stream",
    "model=transformers",
    "model.arch=qwen3",
    "model.config.hidden_size=1024",
    "model.config.intermediate_size=3072",
    "model.config.num_hidden_layers=28",
    "model.config.num_attention_heads=16",
    "model.config.num_key_value_heads=8",
    "model.config.head_dim=128",
    "precision=bf16",
    "optimizer=adamw",
]
STEPS = {
    "timm convnext_tiny, batch 256, amp, channels-last": [
        *TIMM, "model.arch=convnext_tiny", "train_batch_size=256", "algorithms=[channels_last]"
    ],
    "timm vit_base_patch16_224, batch 192, amp": [*TIMM, "model.arch=vit_base_patch16_224", "train_batch_size=192"],
    "timm efficientnet_b0, batch 512, amp, channels-last": [
        *TIMM, "model.arch=efficientnet_b0", "train_batch_size=512", "algorithms=[channels_last]"
    ],
    "timm regnety_016, batch 512, amp, channels-last": [
        *TIMM, "model.arch=regnety_016", "train_batch_size=512", "algorithms=[channels_last]"
    ],
    "transformers qwen3 0.6B, 8 x 2,048 tokens, bf16": [
        *QWEN3_06B, "data.text.max_seq_len=2048", "train_batch_size=8", "data.text.val_tokens=16384"
    ],
    "transformers qwen3 0.6B, 2 x 8,192 tokens, bf16": [
        *QWEN3_06B, "data.text.max_seq_len=8192", "train_batch_size=2", "data.text.val_tokens=16384"
    ],
}  # fmt: skip
CPU_STEPS = {
    "timm convnext_atto at 32 px, batch 4": [
        *TIMM, "model.arch=convnext_atto", "data.resolution=32", "data.eval_resolution=32", "train_batch_size=4",
        "precision=fp32",
    ],
    "transformers qwen3 tiny, 4 x 32 tokens": [
        *QWEN3_06B[:5], "model.config.hidden_size=32", "model.config.intermediate_size=64",
        "model.config.num_hidden_layers=2", "model.config.num_attention_heads=4", "model.config.num_key_value_heads=2",
        "model.config.head_dim=8", "data.text.max_seq_len=32", "train_batch_size=4", "precision=fp32",
    ],
}  # fmt: skip


def hardware_group(requested: str | None) -> str:
    """The hardware group named, else the one of the GPU this process sees (the H200 where none)."""
    if requested:
        return requested
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "H200"
    return next((group for gpu, group in GROUPS.items() if gpu in name), "8xh200")


def predicted_seconds(case: Case, device: Device) -> float:
    """The estimate's time for ``case`` on ``device``: its aten operations on fake tensors, eager."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    log = OperationLog()
    with FakeTensorMode(), AsFusedAttention():
        inputs = case.build(torch.device("cpu"), torch.bfloat16)
        with log:
            case.run(*inputs)
    return device.seconds(log.operations)


def measured_seconds(case: Case, device: torch.device, dtype: torch.dtype, repeats: int) -> float:
    """The median time of ``case`` on ``device`` after warming up (CUDA events on a GPU)."""
    inputs = case.build(device, dtype)
    times = []
    for index in range(repeats + 3):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            case.run(*inputs)
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            began = time.perf_counter()
            case.run(*inputs)
            seconds = time.perf_counter() - began
        if index >= 3:
            times.append(seconds)
    return statistics.median(times)


def step_prediction(overrides: list[str], group: str) -> float | None:
    """``trainrun estimate``'s plain step for the run on one of ``group``'s GPUs."""
    config = validate(compose([*overrides, f"hardware={group}", "launcher.devices=1"]), files=False)
    return estimate(config).step_seconds


def step_measured(overrides: list[str], steps: int, folder: Path) -> float | str:
    """The run's step on this machine's device: ``trainrun`` for ``steps`` steps, the second half's rate."""
    args = [*overrides, f"max_duration={steps}ba", f"eval_interval={steps // 2}ba", "launcher.devices=1"]
    args += ["progress=false", "export=false", "checkpoint.interval=null", "stop_at=null"]
    result = trained(args, folder, timeout=900)
    if isinstance(result, str):
        return f"failed: {result}"
    records, _ = result
    return validate(compose(args), files=False).train_batch_size / records[-1]["throughput"]


def cell(seconds: float | str | None) -> str:
    if seconds is None:
        return "-"
    return seconds if isinstance(seconds, str) else f"{seconds * 1e3:.3f} ms"


def ratio(predicted: float | None, measured: float | str | None) -> str:
    usable = isinstance(measured, float) and predicted
    return f"{predicted / measured:.2f}" if usable else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hardware", help="the GPU's hardware group (default: the GPU this process sees)")
    parser.add_argument("--predict", action="store_true", help="the estimate's column alone, before the GPU call")
    parser.add_argument("--cpu", action="store_true", help="tiny shapes on this CPU: a check of the harness")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30, help="training steps a run")
    args = parser.parse_args()
    group = hardware_group(args.hardware)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    operations, steps = (CPU_OPERATIONS, CPU_STEPS) if args.cpu else (OPERATIONS, STEPS)
    where = torch.cuda.get_device_name() if device.type == "cuda" else "this CPU"
    measuring = "" if args.predict else f", measured on {where}"
    print(f"estimated on hardware={group}{measuring}, torch {torch.__version__}")
    print("| kind | shape | estimated | measured | estimated / measured |")
    print("| --- | --- | ---: | ---: | ---: |")
    gpu = device_of(validate(compose([f"hardware={group}", "precision=bf16"]), files=False))
    for case in operations:
        predicted = predicted_seconds(case, gpu)
        measured = None if args.predict else measured_seconds(case, device, dtype, args.repeats)
        print(f"| {case.kind} | {case.name} | {cell(predicted)} | {cell(measured)} | {ratio(predicted, measured)} |")
    with tempfile.TemporaryDirectory() as scratch:
        for index, (name, overrides) in enumerate(steps.items()):
            predicted = step_prediction(overrides, group)
            measured = None if args.predict else step_measured(overrides, args.steps, Path(scratch) / str(index))
            print(f"| training step | {name} | {cell(predicted)} | {cell(measured)} | {ratio(predicted, measured)} |")


if __name__ == "__main__":
    main()
