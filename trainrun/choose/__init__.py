"""Choices made by measurement before a run: ``recipe=auto`` and ``-o1``.

Both time the user's own config here, each candidate as a ``trainrun`` process training its
whole schedule compressed into a few steps (:class:`Profiler`),
decide, write the decision with its evidence to the run directory (``auto.json``, ``o1.json``)
and the console, and hand the run the overrides they chose.

``recipe=auto`` (with a budget, ``max_duration=30min`` or ``50usd``): for each recipe of a
trade-off table — a ``trainrun report`` CSV of sweeps on the user's data, or the published
ResNet-50 points shipped with trainrun — the budget divided by the recipe's seconds per epoch
here gives the epochs it can afford; its quality at that many epochs is read off the table by
linear interpolation between measured points (beyond them it is extrapolated and marked so); the
recipe with the best predicted quality trains, to the budget, with the scale-schedule ratio of
those epochs.

``-o1``: the systems settings that change only numerics (precision, channels-last or BERT's
fused layers, ``torch.compile``, loader workers and batches ahead), tried one at a time from the user's config
(coordinate descent: each setting's fastest value is kept before the next is tried); a value is
kept only when its step is faster by more than :data:`~trainrun.choose.systems.NOISE` of the best so far.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import yaml
from rich.console import Console

from trainrun import run_files
from trainrun.atomic_io import atomic_write_json
from trainrun.choose.recipes import choose_recipe
from trainrun.choose.systems import choose_systems
from trainrun.config import AUTO_RECIPE, ConfigSource, config_dir


def before_run(overrides: list[str], source: ConfigSource, optimize: bool, console: Console) -> list[str]:
    """Run ``recipe=auto`` and/or ``-o1``; return the run's overrides with their choices applied."""
    run_dir = _run_dir(overrides)
    overrides = [o for o in overrides if not o.startswith("hydra.run.dir=")] + [f"hydra.run.dir={run_dir}"]
    decisions: dict[str, dict] = {}
    if AUTO_RECIPE in overrides:
        overrides, decisions[run_files.AUTO_DECISION] = choose_recipe(overrides, source, console)
    if optimize:
        overrides, decisions["o1.json"] = choose_systems(overrides, source, console)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, decision in decisions.items():
        atomic_write_json(run_dir / name, decision)
        console.print(f"wrote {run_dir / name}", highlight=False)
    return overrides


def _run_dir(overrides: list[str]) -> Path:
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    if given:
        return Path(given[-1])
    # Hydra's default, conf/config.yaml's hydra.run.dir (runs/${now:%Y-%m-%d}/...), resolved now
    pattern = yaml.safe_load((config_dir() / "config.yaml").read_text())["hydra"]["run"]["dir"]
    now = datetime.now()
    return Path(re.sub(r"\$\{now:([^}]*)\}", lambda match: now.strftime(match.group(1)), pattern))
