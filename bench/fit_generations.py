"""Fit what each GPU generation's kernels reach (``trainrun/estimate/generations.yaml``) on its declared
fit set, and nothing else:

- **hopper** on trainrun's own GPU readings (``trainrun/estimate/readings.yaml``'s ``gpu`` rows, each
  with its command, date and device): every share, the half dimension, the floor an operation costs
  and selective checkpointing's policy time, by least squares on the log of each reading's step
  (the step as the estimate times it: a micro-batch's operations as many times as the step has
  micro-batches, the optimizer's operations, the methods' work beside the passes);
- **ampere** and **ada** each on the one published row ``bench/published_times.yaml`` marks ``fits:``
  (FFCV's ResNet-50 on A100s; timm's ResNet-50 forward passes on an RTX 4090): hopper's shares with the
  one a ResNet's operations decide, the convolutions', found so that the row's whole estimate (loaders,
  evaluations, exchange and all) equals its figure.

Every other row of ``bench/published_times.yaml`` is a prediction; tests/test_bench.py holds that no
fit reads one.

    .venv/bin/python bench/fit_generations.py            # the fit and each reading's residual
    .venv/bin/python bench/fit_generations.py --write    # into trainrun/estimate/generations.yaml
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from estimate_validation import composed, estimate_row, rows  # noqa: E402

GROUPS = {"h100": "8xh100_aws", "h200": "8xh200"}  # the hardware group a reading's GPU is described by
PARAMETERS = (
    "matmul",
    "convolution_intensity",
    "attention",
    "memory",
    "half_dimension",
    "floor_s",
    "policy_s",
)
# what the field knows before any reading: cuBLAS's large bf16 GEMMs at about 70 % of an H100's dense
# peak, cuDNN's convolutions at about a third of an A100's (312 TFLOP/s over 1,555 GB/s at 80 %: 80 FLOPs
# a byte of their traffic), FlashAttention-2 at 35 % (FlashAttention-3's paper, Shah et al. 2024: "only
# 35 % utilization on H100 GPUs"; FlashAttention-2's own, about 335 of 989 TFLOP/s), copies at about
# 80 % of HBM's bandwidth, a GEMM dimension of 32 at half its rate, 20 µs an eager operation's dispatch
# and launch, and 50 µs selective checkpointing's policy
PRIOR = (0.7, 80.0, 0.35, 0.8, 32.0, 2e-5, 5e-5)
PRIOR_WEIGHT = 0.3  # a parameter's log off its prior by 1 costs as a reading's log off by 0.3
START = PRIOR
LOWER = (0.05, 5.0, 0.05, 0.3, 1.0, 1e-6, 1e-7)
UPPER = (1.0, 1000.0, 1.0, 1.0, 1024.0, 1e-3, 1e-3)


@dataclass
class ReadStep:
    """One reading's step as the estimate times it, and the step its reading measured."""

    name: str
    passes: int
    operations: list[Any]
    optimizer: tuple[Any, ...]
    methods: tuple[Any, ...]
    timeline: Any
    peak_flops: float
    bandwidth_gb_s: float
    compiled: bool
    policy: bool
    measured_s: float

    def predicted(self, generation: Any) -> float:
        from trainrun.estimate.device import Device, methods_seconds, optimizer_seconds

        device = Device(self.peak_flops, self.bandwidth_gb_s, generation, self.compiled, self.policy)
        beside = optimizer_seconds(device, self.optimizer, []) + methods_seconds(
            device, self.methods, self.timeline, []
        )
        return self.passes * device.seconds(self.operations) + beside


def read_step(rate: Any) -> ReadStep:
    """A reading of ``readings.yaml`` as the step the estimate times, on its GPU's hardware group."""
    from trainrun.estimate import run_shape, sized_task
    from trainrun.estimate.device import peak_at
    from trainrun.estimate.memory import fake_world, measure, pass_operations
    from trainrun.estimate.schedule import method_timeline, planned_timeline

    config = composed([*rate.shape, f"hardware={GROUPS[rate.gpu]}", f"compile={str(rate.compile).lower()}"])
    task = sized_task(config)
    shape = run_shape(config, rate.vocab, rate.real_tokens or 1.0)
    operations = pass_operations(config, task, shape.text, shape.micro_batch, shape.checkpointing)
    with fake_world(shape.ranks):
        memory = measure(config, shape, task)
    value, unit = rate.reading
    units_a_step = config.train_batch_size * (shape.text.max_seq_len if unit == "tokens/s" else 1)
    return ReadStep(
        name=f"{rate.gpu}: {rate.key()}",
        passes=shape.passes,
        operations=operations,
        optimizer=memory.optimizer,
        methods=memory.methods,
        timeline=method_timeline(config, planned_timeline(config, [])),
        peak_flops=peak_at(config) * 1e12,
        bandwidth_gb_s=config.hardware.memory_gb_s,
        compiled=config.compile,
        policy=shape.checkpointing == "selective" and not config.compile,
        measured_s=units_a_step / value,
    )


def generation(name: str, values: Any, fitted_on: list[str]) -> Any:
    from trainrun.estimate.device import Generation

    return Generation(name, *map(float, values), fitted_on=tuple(fitted_on))


def fit_hopper(steps: list[ReadStep]) -> Any:
    """Hopper's parameters: least squares of the log of predicted over measured steps, each parameter's
    log held towards its prior (:data:`PRIOR`) by :data:`PRIOR_WEIGHT`: the readings are fewer than the
    parameters are many, and a parameter they do not decide stays at what the field knows of it."""
    names = [step.name for step in steps]

    def residuals(logs: np.ndarray) -> np.ndarray:
        fitted = generation("hopper", np.exp(logs), names)
        misses = [math.log(step.predicted(fitted) / step.measured_s) for step in steps]
        return np.array([*misses, *(PRIOR_WEIGHT * (logs - np.log(PRIOR)))])

    solved = least_squares(residuals, np.log(START), bounds=(np.log(LOWER), np.log(UPPER)))
    return generation("hopper", np.exp(solved.x), names)


def fit_convolutions(hopper: Any, fitted: dict[str, Any], row: dict[str, Any]) -> Any:
    """The generation ``row`` fits (a ResNet's run on it): hopper's shares with the convolutions'
    intensity (what a ResNet decides) the one that makes ``row``'s estimate its published figure
    (bisection on its log; the estimate's step falls as it grows); none (infinite) where the row ran
    faster than its estimate without one: no traffic bound holds its convolutions there."""
    import trainrun.estimate.device as device

    name = row["fits"]

    def scaled(intensity: float) -> Any:
        found = "no convolution traffic bound reaches it" if math.isinf(intensity) else "convolution fitted"
        note = f"{row['id']}: {found}, the rest hopper's"
        return dataclasses.replace(hopper, name=name, convolution_intensity=intensity, fitted_on=(note,))

    def step_ratio(intensity: float) -> float:
        original = device.generations
        device.generations = lambda: {**fitted, name: scaled(intensity)}
        try:
            return estimate_row(row).step_ratio
        finally:
            device.generations = original

    if step_ratio(math.inf) < 1:
        return scaled(math.inf)
    bound = PARAMETERS.index("convolution_intensity")
    low, high = math.log(LOWER[bound]), math.log(UPPER[bound])
    for _ in range(12):
        middle = (low + high) / 2
        low, high = (low, middle) if step_ratio(math.exp(middle)) > 1 else (middle, high)
    return scaled(math.exp((low + high) / 2))


def as_yaml(fitted: dict[str, Any]) -> dict[str, Any]:
    values = {}
    for name, found in fitted.items():
        values[name] = {key: float(f"{getattr(found, key):.4g}") for key in PARAMETERS}
        values[name]["fitted_on"] = list(found.fitted_on)
    return values


def write(fitted: dict[str, Any]) -> None:
    """Replace the generations in ``generations.yaml``, keeping its header and ``nearest``."""
    from trainrun.estimate.device import GENERATIONS

    text = GENERATIONS.read_text()
    header = text.split("generations:")[0]
    nearest = text[text.index("# a generation with no fit") :]
    body = yaml.safe_dump({"generations": as_yaml(fitted)}, sort_keys=False, width=200)
    GENERATIONS.write_text(header + body + nearest)


def main() -> int:
    from trainrun.estimate.datasheets import rates

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write trainrun/estimate/generations.yaml")
    args = parser.parse_args()
    steps = [read_step(rate) for rate in rates().gpu]
    hopper = fit_hopper([step for step, rate in zip(steps, rates().gpu, strict=True) if rate.fit])
    for step in steps:
        print(f"{step.name}: measured {step.measured_s * 1e3:.1f} ms, fitted {step.predicted(hopper) * 1e3:.1f} ms")
    fitted = {"hopper": hopper}
    for row in rows():
        if "fits" in row:
            fitted[row["fits"]] = fit_convolutions(hopper, fitted, row)
    print(yaml.safe_dump(as_yaml(fitted), sort_keys=False, width=200))
    if args.write:
        write(fitted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
