"""``trainrun estimate [OVERRIDES]``: a run's memory per rank and its time and cost at its real size,
computed on this machine before a GPU is rented (:mod:`trainrun.estimate`): its operations on the
GPU's datasheet, phase by phase of its schedule, naming what holds each phase back (GPU, loader or links).

The overrides are a run's (``recipe=llama31_8b launcher.devices=8 hardware=8xh100_aws``), composed
and validated as ``trainrun`` would (the data files need not be here). ``--json`` prints one JSON
object for scripts; the exit code is 0 when the peak fits the hardware's device memory, 3 when it
does not, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from trainrun.command_line import split_location_flags
from trainrun.config import ConfigSource, check, locate, translate
from trainrun.core.time import is_budget
from trainrun.errors import ConfigError

if TYPE_CHECKING:
    from trainrun.estimate import Estimate
    from trainrun.schema import TrainConfig

DOES_NOT_FIT = 3  # the exit code of an estimate whose peak is over the device's memory
PLANNED_ENDPOINT = "node0:29400"  # the rendezvous an estimated multi-node run is validated with


def estimate_command(argv: list[str]) -> int:
    location, argv = split_location_flags(argv)  # -cd myconf: a recipe or hardware group of the user's own
    args = _parser().parse_intermixed_args(argv)  # overrides before and after the flags
    check_flags(args)
    hydra_args, overrides, _ = translate(args.overrides)
    if hydra_args:
        raise ConfigError(f"trainrun estimate takes a run's overrides, not '{hydra_args[0]}'")
    source, _, overrides = locate(location, overrides)
    overrides = never_launched(overrides)
    config = on_every_gpu(overrides, source)
    steps, steps_source = target_from(args, config)
    if args.compare:
        return compare(args, overrides, source, (steps, steps_source))
    from trainrun.estimate import estimate

    result = estimate(
        config, args.vocab, args.mfu, args.peak_tflops, steps, args.case_shape, args.real_tokens, steps_source
    )
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(render(result, config))
    return DOES_NOT_FIT if result.fits is False else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainrun estimate",
        description=__doc__.splitlines()[0],
        epilog="Hydra's -cd DIR, -cp DIR and -cn NAME name a config folder of your own (a hardware group "
        "describing your GPU), as for trainrun, before or after the overrides.",
    )
    parser.add_argument("overrides", nargs="*", help="the run's overrides, as trainrun takes them")
    parser.add_argument("--json", action="store_true", help="one JSON object on standard output")
    parser.add_argument(
        "--mfu",
        type=float,
        help="model FLOPs utilisation to time with (default: the step's operations on the GPU's datasheet)",
    )
    parser.add_argument("--peak-tflops", type=float, help="the device's peak (default: the hardware group's)")
    parser.add_argument(
        "--steps", type=int, help="the steps to the target, where known (a reference run's); default: max_duration's"
    )
    parser.add_argument(
        "--from-runs", action="append", type=Path, metavar="FOLDER",
        help="a run or sweep folder (repeatable): the median samples its runs of this recipe took to stop_at",
    )  # fmt: skip
    parser.add_argument("--vocab", type=int, help="a language model's vocabulary (default: the data's)")
    parser.add_argument(
        "--case-shape", type=int, nargs=3, metavar=("D", "H", "W"), help="segmentation: a validation case's voxels"
    )
    parser.add_argument(
        "--real-tokens", type=float, help="masked LM: the share of positions that are tokens (default: the store's)"
    )
    parser.add_argument(
        "--compare", type=_names, metavar="HARDWARE,...",
        help="conf/hardware options to compare (8xa100_aws,8xh100_aws,8xb200): fit, time, cost and bottleneck of each",
    )  # fmt: skip
    parser.add_argument(
        "--nodes",
        type=_counts,
        metavar="N,...",
        help="with --compare: node counts to compare on each (default: the run's)",
    )
    return parser


def never_launched(overrides: list[str]) -> list[str]:
    """``overrides`` with a rendezvous endpoint where they name none: an estimated run is sized, never
    launched, so a multi-node one needs no port, endpoint or reachable master of the user's."""
    if any(override.startswith("launcher.rdzv_endpoint=") for override in overrides):
        return overrides
    return [*overrides, f"launcher.rdzv_endpoint={PLANNED_ENDPOINT}"]


def on_every_gpu(overrides: list[str], source: ConfigSource) -> TrainConfig:
    """The run ``overrides`` compose, checked, on every GPU of its hardware group's node where
    ``launcher.devices`` is ``auto``, as ``trainrun`` launches there (one where it states no ``devices``)."""
    (config,) = check(overrides, files=False, source=source)
    devices, name = config.hardware.devices, config.hardware.name
    if config.launcher.devices != "auto" or not devices:
        return config
    try:
        return check([*overrides, f"launcher.devices={devices}"], files=False, source=source)[0]
    except ConfigError as error:  # said of processes the user never named
        raise ConfigError(f"{error}: launcher.devices=auto is {name}'s {devices} GPUs; set it for fewer") from None


def check_flags(args: argparse.Namespace) -> None:
    """The flags' own bounds, before the run is composed."""
    if args.nodes and not args.compare:
        raise ConfigError("bad value for '--nodes': it counts the nodes of each --compare option; give --compare")
    if args.mfu is not None and not 0 < args.mfu <= 1:
        raise ConfigError(f"bad value for '--mfu': {args.mfu} (a fraction in (0, 1])")
    if args.peak_tflops is not None and not 0 < args.peak_tflops < math.inf:
        raise ConfigError(f"bad value for '--peak-tflops': {args.peak_tflops} (a device's peak: a positive number)")
    if args.real_tokens is not None and not 0 < args.real_tokens <= 1:
        raise ConfigError(f"bad value for '--real-tokens': {args.real_tokens} (a fraction in (0, 1])")
    for flag, value in (
        ("--vocab", args.vocab),
        ("--steps", args.steps),
        *(("--case-shape", side) for side in args.case_shape or []),
    ):
        if value is not None and value < 1:
            raise ConfigError(f"bad value for '{flag}': {value} (a positive number)")


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if not any(names):
        raise argparse.ArgumentTypeError(f"'{text}' names no conf/hardware option")
    if not all(names):
        raise argparse.ArgumentTypeError(f"'{text}' has an empty option (8xa100_aws,8xh100_aws)")
    return names


def _counts(text: str) -> list[int]:
    counts = [part.strip() for part in text.split(",")]
    if not all(count.isdigit() and int(count) > 0 for count in counts):
        raise argparse.ArgumentTypeError(f"'{text}' is not a list of positive node counts (1,2,4)")
    return [int(count) for count in counts]


def compare(args: argparse.Namespace, overrides: list[str], source: ConfigSource, steps: tuple[int | None, str]) -> int:
    """``--compare``: the run on each hardware option (and node count), one table: whether it fits, its
    time and cost to the target (or the schedule), what holds it back; the cheapest and the fastest
    marked. Every option is composed and checked before any is estimated."""
    from trainrun.estimate import estimate

    nodes = args.nodes or [None]
    configs = []
    for hardware in args.compare:
        for count in nodes:
            extra = [f"hardware={hardware}"] + ([f"launcher.nnodes={count}"] if count else [])
            try:
                config = on_every_gpu([*overrides, *extra], source)
            except ConfigError as error:
                raise ConfigError(
                    f"bad value for '--compare': {hardware}{f' on {count} nodes' if count else ''}: {error}"
                ) from None
            configs.append(config)
    to_target, told = steps
    flags = (args.vocab, args.mfu, None, to_target, args.case_shape, args.real_tokens, told)
    figures = comparison_rows((config, estimate(config, *flags)) for config in configs)
    print(json.dumps(figures) if args.json else comparison_table(figures))
    return 0


def comparison_rows(estimates: Iterable[tuple[TrainConfig, Estimate]]) -> list[dict]:
    """Each option's figures, as ``--compare --json`` gives them, with its scaling on its hardware."""
    figures = [comparison_row(config, result) for config, result in estimates]
    with_scaling(figures)
    return figures


def comparison_row(config: TrainConfig, result: Estimate) -> dict:
    """One option's figures: the time and cost to the target, or to the whole schedule where the run
    stops at a target whose steps are not known (``time_to``), how its GPUs were timed and the error
    the validation shows for that."""
    from trainrun.estimate.device import validation_error

    return {
        "hardware": config.hardware.name,
        "nodes": config.launcher.nnodes,
        "ranks": result.ranks,
        "fits": result.fits,
        "peak_gb": result.highest_gb,
        "device_memory_gb": result.device_memory_gb,
        "time_to": "schedule" if result.stops_before_the_schedule else result.time_to,
        "budget": is_budget(config.max_duration),
        "steps": result.steps,
        "hours": result.hours,
        "cost": result.cost,
        "bottlenecks": result.bottlenecks,
        "basis": result.rate_basis,
        "error": validation_error(result.rate_basis),
    }


def with_scaling(figures: list[dict]) -> None:
    """Each row's scaling efficiency on its hardware: its steps a node-hour over the fewest nodes'
    (the same steps: their node-hours over its own; under a budget, the same hours)."""

    def per_node_hour(row: dict) -> float:
        return row["steps"] / (row["hours"] * row["nodes"])

    for row in figures:
        same = [other for other in figures if other["hardware"] == row["hardware"] and other["hours"]]
        fewest = min(same, key=lambda other: other["nodes"], default=None)
        if fewest is not None and row["hours"] and len(same) > 1:
            row["scaling"] = per_node_hour(row) / per_node_hour(fewest)


def best_options(figures: list[dict], budgeted: bool) -> tuple[tuple[str, dict | None], ...]:
    """The marks of those that fit: the fastest and the cheapest, or where ``budgeted`` (the same time
    or money on each) the option whose budget buys the most steps; each only where it leads the next
    by more than the error the validation shows for how the two were timed (none where unknown)."""
    fitting = [row for row in figures if row["fits"] is not False and row["hours"]]
    if budgeted:
        return (("most steps", clear_lead(fitting, "steps", larger=True)),)
    priced = [row for row in fitting if row["cost"]]
    return (("fastest", clear_lead(fitting, "hours")), ("cheapest", clear_lead(priced, "cost")))


def clear_lead(rows: list[dict], key: str, larger: bool = False) -> dict | None:
    """The row of least ``key`` (``larger``: of most) where it leads the next by more than the larger
    of their validation errors (a single row leads none: there is nothing to lead); None otherwise."""
    ranked = sorted(rows, key=lambda row: row[key] or 0, reverse=larger)
    if len(ranked) < 2:
        return ranked[0] if ranked else None
    best, second = ranked[:2]
    if best["error"] is None or second["error"] is None:
        return None
    margin = 1 + max(best["error"], second["error"])
    leads = best[key] > second[key] * margin if larger else second[key] > best[key] * margin
    return best if leads else None


def comparison_table(figures: list[dict]) -> str:
    """The options side by side (:func:`comparison_rows`), the best of those that fit marked."""
    budgeted = any(row["budget"] for row in figures)
    best = best_options(figures, budgeted)
    header = (
        "| hardware | nodes | ranks | peak / device GB | fits | steps | time | cost | bottleneck | scaling | timed | |"
    )
    lines = [header, "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | --- | --- |"]
    for row in figures:
        memory = (
            f"{row['peak_gb']:.1f} / {row['device_memory_gb']:g}"
            if row["device_memory_gb"]
            else f"{row['peak_gb']:.1f} / ?"
        )
        fits = {True: "yes", False: "NO", None: "?"}[row["fits"]]
        time = duration(row["hours"]) if row["hours"] else "-"
        cost = dollars(row["cost"]) if row["cost"] else "-"
        marks = ", ".join(name for name, chosen in best if chosen is row)
        steps = f"{row['steps']:,}" if row["steps"] else "-"
        bottleneck = " then ".join(row["bottlenecks"]) or "-"
        place = f"{row['hardware']} | {row['nodes']} | {row['ranks']}"
        scaling = f"{row['scaling']:.0%}" if row.get("scaling") else "-"
        error = f"±{row['error']:.0%}" if row["error"] is not None else "error not validated"
        timed = f"{row['basis']}: {error}"
        lines.append(
            f"| {place} | {memory} | {fits} | {steps} | {time} | {cost} | {bottleneck} | {scaling} | {timed} "
            f"| {marks} |"
        )
    ends = {row["time_to"] for row in figures}
    unmarked = [name for name, chosen in best if chosen is None and len(figures) > 1]
    if unmarked:
        lines.append(
            f"not marked {' or '.join(unmarked)}: no option leads the next by more than the error the validation "
            "shows for how they were timed (docs/estimate.md)"
        )
    if budgeted:
        lines.append("steps: what the budget (max_duration) buys on each; time and cost with its evaluations on top")
    else:
        lines.append(
            "time and cost to the target"
            if ends == {"target"}
            else "time and cost to the end of the schedule (max_duration)"
        )
    return "\n".join(lines)


def target_from(args: argparse.Namespace, config: TrainConfig) -> tuple[int | None, str]:
    """The steps to the target: ``--steps``, or the median samples of finished runs (``--from-runs``)."""
    if args.from_runs is None:
        return args.steps, "--steps"
    if args.steps is not None:
        raise ConfigError("bad value for '--from-runs': give it or --steps, not both")
    if config.stop_at is None:
        raise ConfigError("bad value for '--from-runs': the run sets no stop_at whose steps the runs could give")
    from trainrun.report.runs import samples_to_target

    samples = samples_to_target(args.from_runs, config.name, config.stop_at)
    middle = statistics.median(samples)
    return math.ceil(
        middle / config.train_batch_size
    ), f"the median of {len(samples)} finished run(s): {middle:,.0f} samples"


def time_lines(result: Estimate, config: TrainConfig) -> list[str]:
    """The time (and cost) to the target where its steps were given, else to ``max_duration``, said
    as the whole schedule where the run stops before it; none where the steps are not known."""
    if not result.hours:
        return []
    cost = f", {dollars(result.cost)} at ${config.hardware.price_per_hour:g}/h a node" if result.cost else ""
    if result.time_to == "target":
        end = (
            f"the target (stop_at={config.stop_at:g}, {result.target_source})"
            if config.stop_at is not None
            else "the steps given"
        )
    elif result.stops_before_the_schedule:
        end = f"the end of the whole schedule, max_duration={config.max_duration}, not the target"
    else:
        end = f"max_duration={config.max_duration}"
    plural = "s" if result.evaluations != 1 else ""
    evaluations = f" and {result.evaluations:,} evaluation{plural}" if result.evaluations and result.eval_flops else ""
    return [f"to {end} ({result.steps:,} steps{evaluations}): {duration(result.hours)}{cost}"]


def flops(count: float) -> str:
    """FLOPs in PFLOP, or TFLOP under a tenth of one."""
    return f"{count / 1e15:.2f} PFLOP" if count >= 1e14 else f"{count / 1e12:.2f} TFLOP"


def dollars(amount: float) -> str:
    """Whole dollars, or cents under ten dollars (a short run's cost is not $0)."""
    return f"${amount:,.0f}" if amount >= 10 else f"${amount:.2f}"


def duration(hours: float) -> str:
    """Hours, minutes under two hours, seconds under two minutes."""
    if hours >= 2:
        return f"{hours:,.1f} h"
    return f"{hours * 60:,.1f} min" if hours * 60 >= 2 else f"{hours * 3600:,.1f} s"


def evaluation_parts(result: Estimate) -> str:
    """Where an evaluation's loader is timed: what the GPUs and the loaders take, and which bounds it."""
    gpu, loader = result.eval_gpu_seconds, result.eval_loader_seconds
    if gpu is None or loader is None:
        return ""
    return f" (GPUs {gpu:.1f} s, loaders {loader:.1f} s): {'loader' if loader > gpu else 'GPU'}-bound"


def phase_lines(result: Estimate) -> list[str]:
    """The schedule's phases, consecutive ones held back by the same part said as one line: their
    share of the run, sizes, a step's FLOPs and time on the GPU and through the loader."""
    groups: list[list[dict]] = []
    for phase in result.phases:
        if groups and groups[-1][-1]["bottleneck"] == phase["bottleneck"] and len(result.phases) > 4:
            groups[-1].append(phase)
        else:
            groups.append([phase])
    return [group_line(group) for group in groups]


def spread(values: list[float], form: str) -> str:
    """``first-last`` in ``form``, or one value where they are equal."""
    low, high = form.format(values[0]), form.format(values[-1])
    return low if low == high else f"{low}-{high}"


def group_line(group: list[dict]) -> str:
    first, last = group[0], group[-1]
    if first["resolution"]:
        size = spread([phase["resolution"] for phase in group], "{:g}") + " px"
    elif first["sequence_length"]:
        size = spread([phase["sequence_length"] for phase in group], "{:,}") + " tokens"
    else:
        size = "the run's crops"
    work = spread([phase["step_flops"] / 1e12 for phase in group], "{:,.1f}")
    line = f"  {first['start']:.0%}-{last['end']:.0%} of the run at {size}: {work} TFLOP a step"
    if first["gpu_seconds"]:
        line += ", GPU " + spread([phase["gpu_seconds"] for phase in group], "{:.3f}") + " s"
    if first["loader_seconds"]:
        line += ", loader " + spread([phase["loader_seconds"] for phase in group], "{:.3f}") + " s"
    if first["link_seconds"]:
        exposed = spread([phase["exposed_link_seconds"] for phase in group], "{:.3f}")
        line += f", links {first['link_seconds']:.3f} s ({exposed} s not hidden)"
    return line + (f": {first['bottleneck']}-bound" if first["bottleneck"] else "")


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
    lines.append(f"step: {flops(result.step_flops)} (all ranks, model FLOPs, at the run's full shapes)")
    lines.append(f"rate: {result.rate}")
    if result.loader:
        lines.append(f"loader: {result.loader}")
    if result.step_seconds:
        rate = f", {result.tokens_per_step / result.step_seconds:,.0f} tokens/s" if result.tokens_per_step else ""
        at = f"at {result.mfu:.1%} MFU of {result.peak_tflops:g} TFLOP/s a device"
        lines.append(f"{at}: {result.step_seconds:.3f} s a plain step on the GPUs{rate}")
        lines.append(
            f"schedule ({len(result.phases)} phase(s)); bottleneck: {' then '.join(result.bottlenecks) or 'not known'}"
        )
        lines += phase_lines(result)
        if result.eval_seconds:
            evaluation = f"an evaluation: {flops(result.eval_flops)}, {result.eval_seconds:.1f} s"
            lines.append(evaluation + evaluation_parts(result))
        lines += time_lines(result, config)
        lines.append(f"per 1,000 plain steps: {duration(1000 * result.step_seconds / 3600)}")
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
