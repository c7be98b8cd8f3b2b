"""``trainrun estimate [OVERRIDES]``: a run's memory per rank and its step time at its real size,
computed on this machine before a GPU is rented (:mod:`trainrun.estimate`).

The overrides are a run's (``recipe=llama31_8b launcher.devices=8 hardware=8xh100_aws``), composed
and validated as ``trainrun`` would (the data files need not be here). ``--json`` prints one JSON
object for scripts; the exit code is 0 when the peak fits the hardware's device memory, 3 when it
does not, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING

from trainrun.config import check, locate, translate
from trainrun.errors import ConfigError

if TYPE_CHECKING:
    from trainrun.estimate import Estimate
    from trainrun.schema import TrainConfig

DOES_NOT_FIT = 3  # the exit code of an estimate whose peak is over the device's memory


def estimate_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="trainrun estimate", description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="the run's overrides, as trainrun takes them")
    parser.add_argument("--json", action="store_true", help="one JSON object on standard output")
    parser.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation the time assumes (0.4)")
    parser.add_argument("--peak-tflops", type=float, help="the device's peak (default: the hardware group's)")
    parser.add_argument(
        "--steps", type=int, help="the steps to the target, where known (a reference run's); default: max_duration's"
    )
    parser.add_argument("--vocab", type=int, help="a language model's vocabulary (default: the data's)")
    args = parser.parse_args(argv)
    if not 0 < args.mfu <= 1:
        raise ConfigError(f"bad value for '--mfu': {args.mfu} (a fraction in (0, 1])")
    if args.peak_tflops is not None and not 0 < args.peak_tflops < math.inf:
        raise ConfigError(f"bad value for '--peak-tflops': {args.peak_tflops} (a device's peak: a positive number)")
    for flag, value in (("--vocab", args.vocab), ("--steps", args.steps)):
        if value is not None and value < 1:
            raise ConfigError(f"bad value for '{flag}': {value} (a positive number)")
    hydra_args, overrides, _ = translate(args.overrides)
    if hydra_args:
        raise ConfigError(f"trainrun estimate takes a run's overrides, not '{hydra_args[0]}'")
    source, _, overrides = locate([], overrides)
    (config,) = check(overrides, files=False, source=source)
    from trainrun.estimate import estimate

    result = estimate(config, args.vocab, args.mfu, args.peak_tflops, args.steps)
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(render(result, config))
    return DOES_NOT_FIT if result.fits is False else 0


def time_lines(result: Estimate, config: TrainConfig) -> list[str]:
    """The time (and cost) to the target where its steps were given, else to ``max_duration``, said
    as the whole schedule where the run stops before it; none where the steps are not known."""
    if not result.hours:
        return []
    cost = f", ${result.cost:,.0f} at ${config.hardware.price_per_hour:g}/h a node" if result.cost else ""
    if result.time_to == "target":
        end = f"the target (stop_at={config.stop_at:g})" if config.stop_at is not None else "the steps given"
    elif result.stops_before_the_schedule:
        end = f"the end of the whole schedule, max_duration={config.max_duration}, not the target"
    else:
        end = f"max_duration={config.max_duration}"
    return [f"to {end} ({result.steps:,} steps): {result.hours:,.1f} h{cost}"]


def render(result: Estimate, config: TrainConfig) -> str:
    """The estimate as a person reads it."""
    hardware = config.hardware
    lines = [
        f"{config.name or config.model.name}: {result.ranks} rank(s) on {result.nodes} node(s), {result.mesh}, "
        f"activation checkpointing {result.activation_checkpointing}, precision {config.precision}",
        f"per rank: {result.passes} micro-batch(es) of {result.micro_batch} a step"
        + (f", vocabulary {result.vocab_size:,} ({result.vocab_source})" if result.vocab_size else ""),
        "held between steps (GB): " + ", ".join(f"{key} {value:.2f}" for key, value in result.held.items()),
        f"peak of a training step: {result.peak_gb:.1f} GB ("
        + ", ".join(f"{key} {value:.2f}" for key, value in result.peak.items() if key != "total")
        + ")",
        f"peak of an evaluation micro-batch of {result.eval_micro_batch}: {result.eval_peak_gb:.1f} GB",
    ]
    if result.device_memory_gb:
        verdict, peak = "fits" if result.fits else "DOES NOT FIT", result.highest_gb
        lines.append(
            f"{hardware.name}: {result.device_memory_gb:g} GB a device: {verdict} "
            f"({result.device_memory_gb - peak:+.1f} GB margin, {peak / result.device_memory_gb:.0%} used)"
        )
        if result.fitting:
            lines.append(f"what fits: {result.fitting}")
    else:
        lines.append(f"hardware={hardware.name} states no device memory: choose one that does (hardware=8xh100_aws)")
    lines.append(f"step: {result.step_flops / 1e15:.2f} PFLOP (all ranks, model FLOPs)")
    if result.step_seconds:
        rate = f", {result.tokens_per_step / result.step_seconds:,.0f} tokens/s" if result.tokens_per_step else ""
        at = f"at {result.mfu:.0%} MFU of {result.peak_tflops:g} TFLOP/s a device"
        lines.append(f"{at}: {result.step_seconds:.3f} s a step{rate}")
        lines += time_lines(result, config)
        lines.append(f"per 1,000 steps: {1000 * result.step_seconds / 3600:.2f} h")
    lines += [f"note: {note}" for note in result.notes]
    if result.stops_before_the_schedule:
        lines.append(
            f"note: the run stops at stop_at={config.stop_at:g}, whose steps are not known here: the time and cost "
            "to max_duration are the whole schedule's, an upper bound (give --steps N, the steps a finished run "
            "or a published result took to the target)"
        )
    lines.append(
        "not counted: the CUDA context and allocator fragmentation (keep 2-5 GB spare), the optimizer kernel's scratch"
    )
    return "\n".join(lines)
