"""``trainrun estimate`` against figures nobody here wrote (``bench/published_times.yaml``): each row's
published minutes or rate (of a training step, or of an evaluation's forward passes) beside the
estimate's from the same settings, their ratio, how its GPUs were timed and what held each run back,
grouped by what the row predicts that the fit did not see (``kind``: another schedule, recipe,
model, shape, GPU, node or node count).

A row marked ``fits`` is in a generation's fit set (``bench/fit_generations.py``) or fits the loader's
efficiency (``calibrates``): it is shown, never counted. Every other row is a prediction, within 25 %
of its figure or work left (``miss`` says what the estimate does not model), but a run in software or
a precision trainrun does not run, shown as an ``exception`` and not counted. A row whose settings
were not all published says what it ``assumes`` and is not counted; one whose only unknown is its
node's CPUs (``unnamed_cpus``) is counted where no loader bounds its estimate (the device's step alone
decides it), else not. A setting the estimate asks for that the source does not give (``unknown``: its
name and values spanning what it could be) is tried at each value: the row is counted where the
estimate is the same at all of them, and is an assumption where it is not.

    .venv/bin/python bench/estimate_validation.py            # the table
    .venv/bin/python bench/estimate_validation.py --write    # into docs/estimate.md
    .venv/bin/python bench/estimate_validation.py --rows ffcv_rn50_16 speedrun_21

Rows are estimated on every core, one process each (``--workers`` fewer).
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "bench" / "published_times.yaml"
DOCS = ROOT / "docs" / "estimate.md"
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
    loader_bound: bool  # a phase or the evaluation waits for the loaders
    several_groups: bool = False  # the estimate says its depthwise and grouped convolutions' share
    indifferent: bool = True  # the same estimate at each value of the row's unknown setting

    @property
    def assumes(self) -> str | None:
        """What the row assumes: what it says it assumes, or its unknown setting where that changes its estimate."""
        row = self.row
        if row.get("assumes"):
            return row["assumes"]
        if not self.indifferent:
            tried = ", ".join(row["unknown"]["values"])
            return f"{row['unknown']['what']}, which changes its estimate (tried: {tried})"
        return None

    @property
    def counted(self) -> bool:
        """A prediction whose settings are all known, or whose only unknown (the node's CPUs) does not
        change its estimate."""
        row = self.row
        if "fits" in row or "calibrates" in row or self.assumes or row.get("exception"):
            return False
        return not (row.get("unnamed_cpus") and self.loader_bound)

    @property
    def ratio(self) -> float:
        return self.estimated / self.published

    @property
    def step_ratio(self) -> float:
        """The published time over the estimate's: above 1, the run took longer than estimated."""
        return 1 / self.ratio if self.unit == "min" else self.ratio

    @property
    def within_goal(self) -> bool:
        return abs(self.ratio - 1) <= GOAL


def rows() -> list[dict[str, Any]]:
    return yaml.safe_load(TABLE.read_text())["rows"]


def estimate_row(row: dict[str, Any]) -> Checked:
    """The estimate of ``row``'s settings, composed as ``trainrun estimate`` composes them; at each value
    of its ``unknown`` setting, the first one's kept and whether the others' agree with it (within 0.1 %)."""
    values = row.get("unknown", {}).get("values", [])
    first, *others = [estimated_with(row, [value]) for value in values] or [estimated_with(row, [])]
    first.indifferent = all(abs(other.estimated / first.estimated - 1) <= 1e-3 for other in others)
    return first


def estimate_rows(chosen: list[dict[str, Any]], workers: int | None = None) -> Iterator[Checked]:
    """Each of ``chosen``'s estimates (:func:`estimate_row`), in their order, on ``workers`` processes
    (the cores this process may use by default): each row's fake pass is its own, so rows are
    independent. The processes are spawned, not forked: a fork of a process whose torch has started
    threads can hang."""
    from trainrun.core.distributed import cores_per_process

    workers = min(workers or cores_per_process(1), len(chosen))
    if workers <= 1:
        yield from map(estimate_row, chosen)
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield from pool.map(estimate_row, chosen)


def estimated_with(row: dict[str, Any], extra: list[str]) -> Checked:
    """The estimate of ``row``'s settings and ``extra`` overrides."""
    from trainrun.estimate import estimate
    from trainrun.estimate.device import SEVERAL_GROUPS_NOTE

    config = composed([*row["overrides"], *row.get("settings", []), *extra])
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
        elif published["over"] == "evaluation":  # an evaluation's forward passes, its samples already on the GPU
            estimated = config.data.samples[1] / result.eval_gpu_seconds
        else:  # the schedule's training time, evaluations left out
            seconds = sum((p["end"] - p["start"]) * result.schedule_steps * p["seconds"] for p in result.phases)
            estimated = per_step * result.schedule_steps / seconds
    held = " then ".join(result.bottlenecks)
    loader = (result.eval_loader_seconds or 0) > (result.eval_gpu_seconds or 0) and result.evaluations
    bound = "loader" in result.bottlenecks or bool(loader and unit == "min")
    several_groups = any(note.startswith(SEVERAL_GROUPS_NOTE) for note in result.notes)
    return Checked(row, value, estimated, unit, result.rate, result.rate_basis, held, result.mfu, bound, several_groups)


def composed(overrides: list[str]) -> Any:
    """The config of ``overrides``, composed as ``trainrun estimate`` composes it."""
    from trainrun.commands.estimate import never_launched, on_every_gpu
    from trainrun.config import locate, translate

    _, overrides, _ = translate(overrides)
    source, _, overrides = locate([], overrides)
    return on_every_gpu(never_launched(overrides), source)


KINDS = {  # what a prediction row changes from its generation's fit set, in the table's order
    "schedule": "another schedule of a fitted run",
    "recipe": "another recipe on a fitted node",
    "node": "another node: its CPUs, GPU memory or bandwidth",
    "shape": "trainrun's own GPU, another shape",
    "model": "another model",
    "node count": "another node count",
    "gpu": "another GPU generation",
}


def verdict(item: Checked) -> str:
    """What a row is to the validation: a fit, a pass or a miss, counted or not, and why."""
    row = item.row
    if "fits" in row:
        from trainrun.estimate.device import generations

        if not generations()[row["fits"]].traffic_bound:
            return f"fit ({row['fits']}'s convolutions: no traffic bound reaches the row, bench/fit_generations.py)"
        return f"fit ({row['fits']}'s convolutions, bench/fit_generations.py)"
    if "calibrates" in row:
        return "fit (a node's image workers' efficiency)"
    if row.get("exception"):
        return f"{'yes' if item.within_goal else 'no'} (not counted, an exception: {row['exception']})"
    result = "yes" if item.within_goal else "no: " + row.get("miss", "work left")
    if item.assumes:
        return f"{result} (not counted: assumes {item.assumes})"
    if row.get("unknown"):
        unknown = row["unknown"]
        tried = " and ".join(unknown["values"])
        result += f" (counted: {unknown['what']} is not published; the same estimate at {tried})"
    if row.get("unnamed_cpus") and item.loader_bound:
        return (
            f"{result} (not counted: its node's CPUs are not published ({row['unnamed_cpus']}) and a loader bounds it)"
        )
    return result


def summary(checked: list[Checked]) -> str:
    """The counted predictions: how many within 25 %, their median error, by kind."""
    counted = [item for item in checked if item.counted]
    if not counted:
        return "no counted prediction"
    errors = sorted(abs(item.ratio - 1) for item in counted)
    lines = [
        f"{sum(item.within_goal for item in counted)} of {len(counted)} counted predictions within 25 %, "
        f"median error {errors[len(errors) // 2]:.1%}, largest {errors[-1]:.1%}."
    ]
    for kind, words in KINDS.items():
        chosen = [abs(item.ratio - 1) for item in counted if item.row.get("kind") == kind]
        if chosen:
            lines.append(f"- {words}: {len(chosen)} counted, median error {sorted(chosen)[len(chosen) // 2]:.1%}.")
    return "\n".join(lines)


def markdown(checked: list[Checked]) -> str:
    lines = [
        "| row | kind | published | estimated | ratio | GPUs timed | bottleneck | within 25 % |",
        "| --- | --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    order = {kind: index for index, kind in enumerate(KINDS)}
    for item in sorted(checked, key=lambda item: ("fits" not in item.row, order.get(item.row.get("kind"), -1))):
        form = "{:,.1f}" if item.unit == "min" else "{:,.0f}"
        kind = "fit" if "fits" in item.row or "calibrates" in item.row else item.row.get("kind", "")
        lines.append(
            f"| {item.row['what']} ({item.row['source']}) | {kind} | {form.format(item.published)} {item.unit} "
            f"| {form.format(item.estimated)} {item.unit} | {item.ratio:.2f} | {item.basis} | {item.bottleneck} "
            f"| {verdict(item)} |"
        )
    return "\n".join(lines) + "\n\n" + summary(checked)


def errors(checked: list[Checked]) -> dict[str, float | None]:
    """The median error of the counted predictions by basis (measured, a fitted generation's datasheet,
    an unfitted one's): what ``--compare`` says of each option (trainrun/estimate/errors.yaml)."""
    from trainrun.estimate.device import BASES, basis_kind

    found = {}
    for kind in BASES:
        chosen = sorted(abs(item.ratio - 1) for item in checked if item.counted and basis_kind(item.basis) == kind)
        found[kind] = round(chosen[len(chosen) // 2], 3) if chosen else None
    return found


def several_groups(checked: list[Checked]) -> dict[str, float]:
    """The published step over the estimate's of each counted prediction of a step (not an evaluation's
    forward passes) whose estimate says its depthwise and grouped convolutions' share: what that note
    says the validation shows."""
    steps = [item for item in checked if item.row["published"].get("over") != "evaluation"]
    return {item.row["id"]: round(item.step_ratio, 2) for item in steps if item.counted and item.several_groups}


def write_errors(checked: list[Checked]) -> None:
    from trainrun.estimate.device import ERRORS

    header = "# What bench/estimate_validation.py's counted predictions show, written with its table (--write):\n"
    header += "# the median error by how their GPUs were timed (trainrun estimate --compare says it of each\n"
    header += "# option), and the published step over the estimate's of those whose depthwise and grouped\n"
    header += "# convolutions take a share of the step that the estimate says (its note quotes them).\n"
    found = {"median_error": errors(checked), "several_groups": several_groups(checked)}
    ERRORS.write_text(header + yaml.safe_dump(found, sort_keys=False))


def write(table: str) -> None:
    """Replace the table between the markers in docs/estimate.md."""
    text = DOCS.read_text()
    before, rest = text.split(START)
    _, after = rest.split(END)
    DOCS.write_text(f"{before}{START}\n{table}\n{END}{after}")


def documented() -> str:
    """The table docs/estimate.md holds now."""
    return DOCS.read_text().split(START)[1].split(END)[0].strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", help="only these rows (ids)")
    parser.add_argument("--write", action="store_true", help="write the table into docs/estimate.md")
    parser.add_argument("--workers", type=int, help="processes to estimate rows on (default: every core)")
    args = parser.parse_args()
    chosen = [row for row in rows() if not args.rows or row["id"] in args.rows]
    checked = []
    for item in estimate_rows(chosen, args.workers):
        checked.append(item)
        line = f"{item.row['id']}: published {item.published:g} {item.unit}, estimated {item.estimated:.4g}"
        print(f"{line} ({item.ratio:.3f}, {item.bottleneck})", file=sys.stderr)
    table = markdown(checked)
    print(table)
    if args.write:
        write(table)
        if not args.rows:
            write_errors(checked)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
