"""``trainrun estimate`` against figures nobody here wrote (``bench/published_times.yaml``): each row's
published minutes or rate beside the estimate's from the same settings, their ratio, the rate row
the estimate used and what held each run back. The rows that calibrate a family's rate on a GPU
(``calibrates``) print the utilisation that reproduces them, which ``trainrun/estimate/readings.yaml`` holds;
every other row is a prediction, within 25 % of its figure or work left (``miss`` says what the
estimate does not model). A row whose settings were not published says what it ``assumes``; it is
not counted as a pass.

    .venv/bin/python bench/estimate_validation.py            # the table
    .venv/bin/python bench/estimate_validation.py --write    # into docs/benchmarks.md
    .venv/bin/python bench/estimate_validation.py --rows ffcv_rn50_16 speedrun_21
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "bench" / "published_times.yaml"
DOCS = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- estimate-validation: start -->", "<!-- estimate-validation: end -->"
GOAL = 0.25  # a prediction within this share of its published figure
FLAGS = {"--real-tokens": ("real_token_share", float), "--vocab": ("vocab", int), "--steps": ("steps", int)}


@dataclass
class Checked:
    """One row: the published figure, the estimate's, and what the estimate used."""

    row: dict[str, Any]
    published: float
    estimated: float
    unit: str
    rate: str
    basis: str
    bottleneck: str
    mfu: float

    @property
    def ratio(self) -> float:
        return self.estimated / self.published

    @property
    def within_goal(self) -> bool:
        return abs(self.ratio - 1) <= GOAL

    @property
    def fitted_mfu(self) -> float:
        """The utilisation at which this row's estimate equals its figure (the GPU bounds the run)."""
        return self.mfu * (self.ratio if self.unit == "min" else 1 / self.ratio)


def rows() -> list[dict[str, Any]]:
    return yaml.safe_load(TABLE.read_text())["rows"]


def estimate_row(row: dict[str, Any]) -> Checked:
    """The estimate of ``row``'s settings, composed as ``trainrun estimate`` composes them."""
    from trainrun.estimate import estimate

    config = composed([*row["overrides"], *row.get("settings", [])])
    arguments, flags = {}, list(row.get("args", []))
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        name, kind = FLAGS[flag]
        arguments[name] = kind(value)
    result = estimate(config, **arguments)
    published = row["published"]
    if "minutes" in published:
        value, unit = published["minutes"], "min"
        estimated = result.hours * 60
    else:
        value, unit = published["rate"], published["unit"]
        per_step = config.train_batch_size * (config.data.text.max_seq_len if unit == "tokens/s" else 1)
        if published["over"] == "step":
            estimated = per_step / result.step_seconds
        else:  # the schedule's training time, evaluations left out
            seconds = sum((p["end"] - p["start"]) * result.schedule_steps * p["seconds"] for p in result.phases)
            estimated = per_step * result.schedule_steps / seconds
    held = " then ".join(result.bottlenecks)
    return Checked(row, value, estimated, unit, result.rate, result.rate_basis, held, result.mfu)


def composed(overrides: list[str]) -> Any:
    """The config of ``overrides``, composed as ``trainrun estimate`` composes it."""
    from trainrun.config import check, locate, translate

    _, overrides, _ = translate(overrides)
    source, _, overrides = locate([], overrides)
    (config,) = check(overrides, files=False, source=source)
    return config


def row_roofline(rate: Any) -> tuple[float, float]:
    """A rate row's roofline (readings.yaml's ``roofline`` and ``memory_gb_s``): the share of its GPU's
    peak its shape's training micro-batch reaches on that GPU's roofline, and the GPU's bandwidth;
    for a calibrated row, at the published row's settings and node."""
    from trainrun.estimate import run_shape, sized_task
    from trainrun.estimate.device import Roofline
    from trainrun.estimate.schedule import FlopCounts, base_work

    if rate.basis == "calibrated":
        (row,) = [row for row in rows() if row["id"] == rate.shape[0].split()[-1]]
        config = composed([*row["overrides"], *row.get("settings", [])])
        peak, bandwidth = config.hardware.peak_tflops, config.hardware.memory_gb_s
    else:
        config, group = composed(list(rate.shape)), gpu_group(rate.gpu)
        peak, bandwidth = group["peak_tflops"], group["memory_gb_s"]
    shape = run_shape(config, rate.vocab, rate.real_tokens or 1.0)
    base = base_work(config, shape.text)
    counts = FlopCounts(config, sized_task(config), shape.text, 2, shape.micro_batch)
    roofline = Roofline(float(peak) * 1e12, float(bandwidth), fused=rate.compile)
    share = counts.roofline_at(base.resolution, base.sequence_length, roofline)
    return share, float(bandwidth)


def gpu_group(gpu: str) -> dict[str, Any]:
    """The hardware group that states ``gpu`` (its peak and memory bandwidth)."""
    for path in sorted((ROOT / "conf" / "hardware").glob("*.yaml")):
        group = yaml.safe_load(path.read_text())
        if group.get("gpu") == gpu:
            return group
    raise ValueError(f"no hardware group states gpu: {gpu}")


def measured_mfu(rate: Any) -> float:
    """A measured rate row's utilisation: trainrun's FLOP count of its shape (a training step's
    forward and backward) over the GPU's peak and the step's time less its optimizer's operations
    and its methods' work beside the passes (timed one by one as the estimate times them, their
    products at the utilisation found)."""
    from trainrun.estimate import run_shape, sized_task
    from trainrun.estimate.device import methods_seconds, operations_seconds
    from trainrun.estimate.memory import fake_world, measure, pass_flops
    from trainrun.estimate.schedule import interval_timeline, timeline_of

    config = composed(list(rate.shape))
    task = sized_task(config)
    shape = run_shape(config, rate.vocab, rate.real_tokens or 1.0)
    per_sample = pass_flops(config, task, shape.text, 2) / 2
    with fake_world(shape.ranks):
        memory = measure(config, shape, task)
    timeline = interval_timeline(config, timeline_of(config, []))
    value, unit = rate.reading
    samples = value / shape.text.max_seq_len if unit == "tokens/s" else value
    group, batch = gpu_group(rate.gpu), config.train_batch_size
    peak = float(group["peak_tflops"]) * 1e12
    mfu = samples * per_sample / peak
    for _ in range(5):  # the optimizer's products at the utilisation found: a few rounds settle it
        stepping = operations_seconds(memory.optimizer, peak * mfu, group["memory_gb_s"])
        stepping += methods_seconds(memory.methods, peak * mfu, group["memory_gb_s"], timeline, [])
        mfu = batch * per_sample / (peak * (batch / samples - stepping))
    return mfu


def markdown(checked: list[Checked]) -> str:
    from trainrun.estimate.datasheets import rates

    floor = f"the floor an eager operation costs, {rates().operation_floor_s * 1e6:g} µs"
    efficiency = rates().cpu.image_loader_efficiency
    lines = [
        "| row | published | estimated | ratio | rate row | bottleneck | within 25 % |",
        "| --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for item in checked:
        form = "{:,.1f}" if item.unit == "min" else "{:,.0f}"
        assumed = f" (assumes {item.row['assumes']}: not counted as a pass)" if item.row.get("assumes") else ""
        if item.row.get("calibrates") == "operation_floor_s":
            verdict = f"calibration ({floor}, fitted)"
        elif item.row.get("calibrates") == "image_loader_efficiency":
            verdict = f"calibration (a node's image workers at {efficiency:.1%} of their single-thread rate, fitted)"
        elif item.row.get("calibrates"):
            verdict = f"calibration ({item.fitted_mfu:.1%} MFU fitted)"
        elif item.within_goal:
            verdict = "yes" + assumed
        else:
            verdict = "no: " + item.row.get("miss", "work left") + assumed
        lines.append(
            f"| {item.row['what']} ({item.row['source']}) | {form.format(item.published)} {item.unit} "
            f"| {form.format(item.estimated)} {item.unit} | {item.ratio:.2f} | {item.rate} | {item.bottleneck} "
            f"| {verdict} |"
        )
    return "\n".join(lines)


def write(table: str) -> None:
    """Replace the table between the markers in docs/benchmarks.md."""
    text = DOCS.read_text()
    before, rest = text.split(START)
    _, after = rest.split(END)
    DOCS.write_text(f"{before}{START}\n{table}\n{END}{after}")


def documented() -> str:
    """The table docs/benchmarks.md holds now."""
    return DOCS.read_text().split(START)[1].split(END)[0].strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", help="only these rows (ids)")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    parser.add_argument("--rates", action="store_true", help="the measured rate rows' MFU, recounted, instead")
    args = parser.parse_args()
    if args.rates:
        from trainrun.estimate.datasheets import rates

        for rate in rates().gpu:
            row = f"{rate.key()} {rate.gpu}"
            if rate.basis == "measured":
                print(f"{row}: table {rate.mfu:.4f}, recounted {measured_mfu(rate):.4f}")
            if rate.roofline is not None:
                share, bandwidth = row_roofline(rate)
                table = f"{rate.roofline} at {rate.memory_gb_s} GB/s"
                print(f"{row}: roofline table {table}, recounted {share:.4f} at {bandwidth:g}")
        return 0
    chosen = [row for row in rows() if not args.rows or row["id"] in args.rows]
    checked = []
    for row in chosen:
        checked.append(estimate_row(row))
        item = checked[-1]
        line = f"{row['id']}: published {item.published:g} {item.unit}, estimated {item.estimated:.4g}"
        print(f"{line} ({item.ratio:.3f}; fits at {item.fitted_mfu:.4f} MFU)", file=sys.stderr)
    table = markdown(checked)
    print(table)
    if args.write:
        write(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
